//! The optimizers' `state_dict` as flat named tensors, and loading it back.
//!
//! Layout (parameters numbered globally in group order, as PyTorch numbers them):
//! `state.{i}.{name}` for parameter `i`'s state, `param_groups.{g}.params` (i64 numbers)
//! and `param_groups.{g}.{hyperparameter}` (0-dim f64, `betas` 1-D f64 of two, flags 0-dim
//! bool). All tensors are copies: stepping on does not change a dict already taken, and a
//! loaded dict is not aliased.

use std::collections::BTreeMap;

use ember_tensor::{Device, Scalar, Tensor as Raw};

use super::{Groups, Hyper, ParamGroup, follow};
use crate::{NnError, Result, StateDict};

/// One parameter's optimizer state, as named tensors.
pub(crate) trait ParamState: Sized {
    /// Every name the state may have.
    const NAMES: &'static [&'static str];
    /// Names of 0-dim entries kept as saved (Adam's `step`); the others have the
    /// parameter's shape and follow its device and dtype.
    const SCALARS: &'static [&'static str];

    /// The named tensors (not copied yet).
    fn entries(&self) -> Result<Vec<(&'static str, Raw)>>;

    /// The state from checked entries (scalars as saved, the others on the parameter's
    /// device and dtype), or the names it needs and lacks.
    fn from_entries(
        entries: BTreeMap<&'static str, Raw>,
    ) -> std::result::Result<Self, Vec<&'static str>>;

    /// Checks a loaded state's values as the optimizer would have made them (Adam's `step`
    /// a whole number `>= 0`); `key` is the state's prefix (`state.3`) for messages.
    fn validate(&self, _key: &str) -> Result<()> {
        Ok(())
    }
}

/// A fresh copy of `t` (never sharing `t`'s storage).
fn owned(t: &Raw) -> Result<Raw> {
    t.copy()
}

pub(super) fn f64_entry(v: f64) -> Result<Raw> {
    Raw::scalar(v, Device::Cpu)
}

pub(super) fn bool_entry(v: bool) -> Result<Raw> {
    Raw::scalar(v, Device::Cpu)
}

/// The hyperparameters of a group as named tensors.
fn group_entries(g: &ParamGroup) -> Result<Vec<(&'static str, Raw)>> {
    let mut out = vec![
        ("lr", f64_entry(g.lr)?),
        ("weight_decay", f64_entry(g.weight_decay)?),
        ("maximize", bool_entry(g.maximize)?),
    ];
    match g.hyper {
        Hyper::Sgd {
            momentum,
            dampening,
            nesterov,
        } => out.extend([
            ("momentum", f64_entry(momentum)?),
            ("dampening", f64_entry(dampening)?),
            ("nesterov", bool_entry(nesterov)?),
        ]),
        Hyper::Adam {
            betas,
            eps,
            amsgrad,
            decoupled_weight_decay,
        } => out.extend([
            (
                "betas",
                Raw::from_vec(vec![betas.0, betas.1], [2], Device::Cpu)?,
            ),
            ("eps", f64_entry(eps)?),
            ("amsgrad", bool_entry(amsgrad)?),
            (
                "decoupled_weight_decay",
                bool_entry(decoupled_weight_decay)?,
            ),
        ]),
    }
    Ok(out)
}

/// Reads the value of a one-element entry.
pub(super) fn scalar_of(key: &str, t: &Raw) -> Result<Scalar> {
    t.to_scalar().map_err(|_| {
        NnError::invalid(
            "load_state_dict",
            format!("{key}: expected one value, found shape {}", t.shape()),
        )
        .into()
    })
}

pub(super) fn read_f64(key: &str, t: &Raw) -> Result<f64> {
    Ok(scalar_of(key, t)?.to_f64())
}

pub(super) fn read_bool(key: &str, t: &Raw) -> Result<bool> {
    Ok(scalar_of(key, t)?.to_f64() != 0.0)
}

/// Sets `g`'s hyperparameters from `entries` (by name), noting missing names.
fn load_group(
    g: &mut ParamGroup,
    prefix: &str,
    entries: &mut BTreeMap<String, Raw>,
    missing: &mut Vec<String>,
) -> Result<()> {
    let mut take = |name: &str| {
        let t = entries.remove(name);
        if t.is_none() {
            missing.push(format!("{prefix}.{name}"));
        }
        t.map(|t| (format!("{prefix}.{name}"), t))
    };
    if let Some((k, t)) = take("lr") {
        g.lr = read_f64(&k, &t)?;
    }
    if let Some((k, t)) = take("weight_decay") {
        g.weight_decay = read_f64(&k, &t)?;
    }
    if let Some((k, t)) = take("maximize") {
        g.maximize = read_bool(&k, &t)?;
    }
    match &mut g.hyper {
        Hyper::Sgd {
            momentum,
            dampening,
            nesterov,
        } => {
            if let Some((k, t)) = take("momentum") {
                *momentum = read_f64(&k, &t)?;
            }
            if let Some((k, t)) = take("dampening") {
                *dampening = read_f64(&k, &t)?;
            }
            if let Some((k, t)) = take("nesterov") {
                *nesterov = read_bool(&k, &t)?;
            }
        }
        Hyper::Adam {
            betas,
            eps,
            amsgrad,
            decoupled_weight_decay,
        } => {
            if let Some((k, t)) = take("betas") {
                let v = t.to_dtype(ember_tensor::DType::F64)?.flatten_all()?;
                match v.to_vec::<f64>()?.as_slice() {
                    &[b0, b1] => *betas = (b0, b1),
                    _ => {
                        return Err(NnError::invalid(
                            "load_state_dict",
                            format!("{k}: expected two values, found shape {}", t.shape()),
                        )
                        .into());
                    }
                }
            }
            if let Some((k, t)) = take("eps") {
                *eps = read_f64(&k, &t)?;
            }
            if let Some((k, t)) = take("amsgrad") {
                *amsgrad = read_bool(&k, &t)?;
            }
            if let Some((k, t)) = take("decoupled_weight_decay") {
                *decoupled_weight_decay = read_bool(&k, &t)?;
            }
        }
    }
    Ok(())
}

/// `state.{i}.{name}` or `param_groups.{g}.{name}` split into its parts.
enum Key<'a> {
    State(usize, &'a str),
    Group(usize, &'a str),
}

fn parse_key(key: &str) -> Option<Key<'_>> {
    let split = |rest: &'static str| -> Option<(usize, &str)> {
        let body = key.strip_prefix(rest)?;
        let (index, name) = body.split_once('.')?;
        Some((index.parse().ok()?, name))
    };
    if let Some((i, name)) = split("state.") {
        Some(Key::State(i, name))
    } else {
        split("param_groups.").map(|(g, name)| Key::Group(g, name))
    }
}

impl<S: ParamState> Groups<S> {
    /// See [`Optimizer::state_dict`](super::Optimizer::state_dict).
    pub(crate) fn state_dict(&self) -> Result<StateDict> {
        let mut out = StateDict::new();
        let mut next = 0usize;
        for (g, group) in self.groups.iter().enumerate() {
            let ids: Vec<i64> = (next..next + group.params.len())
                .map(|i| i64::try_from(i).unwrap_or(i64::MAX))
                .collect();
            let slots = self.state.get(g).map(Vec::as_slice).unwrap_or(&[]);
            for (j, slot) in slots.iter().enumerate().take(group.params.len()) {
                if let Some(s) = slot {
                    for (name, t) in s.entries()? {
                        out.insert(format!("state.{}.{name}", next + j), owned(&t)?);
                    }
                }
            }
            let n = ids.len();
            out.insert(
                format!("param_groups.{g}.params"),
                Raw::from_vec(ids, [n], Device::Cpu)?,
            );
            for (name, t) in group_entries(group)? {
                out.insert(format!("param_groups.{g}.{name}"), t);
            }
            next += group.params.len();
        }
        // Sorted by key, as the flat layout has always been listed.
        out.sort_keys();
        Ok(out)
    }

    /// See [`Optimizer::load_state_dict`](super::Optimizer::load_state_dict).
    pub(crate) fn load_state_dict(&mut self, sd: &StateDict) -> Result<()> {
        let invalid = |msg: &str| Err(NnError::invalid("load_state_dict", msg.to_string()).into());
        let (mut missing, mut unexpected, mut mismatched) = (Vec::new(), Vec::new(), Vec::new());
        let mut group_entries: BTreeMap<usize, BTreeMap<String, Raw>> = BTreeMap::new();
        let mut state_entries: BTreeMap<usize, Vec<(&String, &str, Raw)>> = BTreeMap::new();
        for (key, t) in sd {
            match parse_key(key) {
                Some(Key::Group(g, name)) => {
                    group_entries
                        .entry(g)
                        .or_default()
                        .insert(name.to_string(), t.data());
                }
                Some(Key::State(i, name)) => {
                    state_entries
                        .entry(i)
                        .or_default()
                        .push((key, name, t.data()));
                }
                None => unexpected.push(key.clone()),
            }
        }
        // Plain values have no place in an optimizer's dict (its numbers are 0-dim tensors).
        unexpected.extend(sd.plain().map(|(k, _)| k.clone()));
        if group_entries.len() != self.groups.len()
            || group_entries.keys().any(|&g| g >= self.groups.len())
        {
            return invalid("loaded state dict has a different number of parameter groups");
        }

        // Saved parameter numbers -> (group, position), hyperparameters into new groups.
        let mut owner: BTreeMap<usize, (usize, usize)> = BTreeMap::new();
        let mut groups = self.groups.clone();
        for (g, entries) in &mut group_entries {
            let group = &mut groups[*g];
            match entries.remove("params") {
                None => missing.push(format!("param_groups.{g}.params")),
                Some(ids) => {
                    let ids = ids.to_dtype(ember_tensor::DType::I64)?.flatten_all()?;
                    let ids = ids.to_vec::<i64>()?;
                    if ids.len() != group.params.len() {
                        return invalid(
                            "loaded state dict contains a parameter group that doesn't match the size of optimizer's group",
                        );
                    }
                    for (j, id) in ids.into_iter().enumerate() {
                        let id = usize::try_from(id).map_err(|_| {
                            NnError::invalid(
                                "load_state_dict",
                                format!("negative parameter number {id}"),
                            )
                        })?;
                        if owner.insert(id, (*g, j)).is_some() {
                            return invalid(&format!("parameter number {id} is in two groups"));
                        }
                    }
                }
            }
            load_group(group, &format!("param_groups.{g}"), entries, &mut missing)?;
            unexpected.extend(
                entries
                    .keys()
                    .map(|name| format!("param_groups.{g}.{name}")),
            );
        }

        // Per-parameter state, checked and moved to its parameter.
        let mut state: Vec<Vec<Option<S>>> = groups
            .iter()
            .map(|g| (0..g.params.len()).map(|_| None).collect())
            .collect();
        for (id, entries) in state_entries {
            let Some(&(g, j)) = owner.get(&id) else {
                unexpected.extend(entries.iter().map(|(k, _, _)| (*k).clone()));
                continue;
            };
            let param = groups[g].params[j].data();
            let mut named = BTreeMap::new();
            // Entries there but of the wrong shape: reported as mismatched, not missing too.
            let mut misshapen = Vec::new();
            for (key, name, t) in entries {
                let Some(&name) = S::NAMES.iter().find(|n| **n == name) else {
                    unexpected.push(key.clone());
                    continue;
                };
                if S::SCALARS.contains(&name) {
                    named.insert(name, owned(&t)?);
                } else if t.dims() != param.dims() {
                    mismatched.push((key.clone(), t.shape().clone(), param.shape().clone()));
                    misshapen.push(name);
                } else {
                    let moved = follow(t.clone(), &param)?;
                    let moved = if moved.shares_storage(&t) {
                        owned(&moved)?
                    } else {
                        moved
                    };
                    named.insert(name, moved);
                }
            }
            match S::from_entries(named) {
                Ok(s) => {
                    s.validate(&format!("state.{id}"))?;
                    state[g][j] = Some(s);
                }
                Err(lacking) => {
                    missing.extend(
                        lacking
                            .into_iter()
                            .filter(|n| !misshapen.contains(n))
                            .map(|n| format!("state.{id}.{n}")),
                    );
                }
            }
        }

        if !(missing.is_empty() && unexpected.is_empty() && mismatched.is_empty()) {
            return Err(NnError::StateDict {
                module: self.name.to_string(),
                missing,
                unexpected,
                mismatched,
            }
            .into());
        }
        for g in &groups {
            g.validate(self.name)?;
        }
        self.groups = groups;
        self.state = state;
        Ok(())
    }
}
