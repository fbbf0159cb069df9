//! `cargo xtask onednn`: install oneDNN (the library behind PyTorch's CPU convolutions) from
//! PyPI into `target/onednn`, where `ember-tensor` finds it at run time
//! (`target/onednn/lib/libdnnl.so.3`). Optional: without it Ember's CPU convolutions run on
//! its own kernels. The wheel is `onednn-cpu-gomp` (oneDNN 3.2, GNU OpenMP, no other
//! dependency than `libgomp`, which GCC's runtime provides); Apache-2.0. See
//! docs/cpu-convolutions.md.

/// The pinned oneDNN wheel.
const ONEDNN: &str = "onednn-cpu-gomp==2023.2.0";

pub fn run(args: &[String]) -> Result<(), String> {
    if let Some(a) = args.first() {
        return Err(format!("`onednn` takes no arguments, found {a:?}"));
    }
    let lib = crate::mkl::install_wheel(ONEDNN, "onednn", "libdnnl.so.3")?;
    eprintln!(
        "==> oneDNN installed in {}; `ember info` reports the convolution backend",
        lib.display()
    );
    Ok(())
}
