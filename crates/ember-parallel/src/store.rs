//! [`TcpStore`]: the rendezvous key-value store on `MASTER_ADDR:MASTER_PORT`, as torchrun's
//! `TCPStore`: one process serves it (rank 0, or `ember launch` on node 0: Note [Agent
//! store] in `launch.rs`), every rank is a client. `set`, `get` (waits until the key exists,
//! at most the store's timeout), `add` (an atomic counter) and `check` (whether keys exist,
//! without waiting). The `nccl` backend exchanges NCCL's unique id through it and the ranks
//! meet there before and after joining NCCL (Note [Rendezvous barriers] in `rendezvous.rs`);
//! it moves a few bytes a few times, so it is a thread per connection over blocking sockets.
//!
//! Note [Store binding]: as torch's `TCPStore`, the server listens on every interface of its
//! host (`0.0.0.0:PORT`) unless told one address ([`TcpStore::serve`]): `MASTER_ADDR` names
//! the host for the clients, which may reach it through another interface than the one the
//! name resolves to there. Clients connect with retries until the store's timeout (the
//! server may start after them), then fail naming the address. A client whose server ends
//! (its process died) fails at its next call, or at once when it is waiting, saying that the
//! store's owner closed the connection: never a hang.
//!
//! A store may carry a key prefix ([`TcpStore::with_prefix`], torch's `PrefixStore`): the
//! workers of `ember launch` use `/worker/attempt_N/` so that the keys of a restarted
//! attempt never meet those of the one before.
//!
//! Wire format, little-endian: a request is `op: u8`, `key_len: u32`, `key`, then for `set`
//! `value_len: u64` and `value`, for `get` `timeout_ms: u64`, for `add` `delta: i64`, for
//! `check` nothing. A reply is `status: u8` (0 ok, 1 timed out or absent) and `value_len:
//! u64`, `value` (`add` replies with the new count as 8 bytes).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ember_autograd::{ErrorKind, Result};

use crate::error::dist_error;

const OP_SET: u8 = 1;
const OP_GET: u8 = 2;
const OP_ADD: u8 = 3;
const OP_CHECK: u8 = 4;
const STATUS_OK: u8 = 0;
const STATUS_TIMEOUT: u8 = 1;
/// Longest key or value the server accepts (a store for ids, not for data).
const MAX_LEN: u64 = 64 << 20;

type Map = Arc<(Mutex<HashMap<String, Vec<u8>>>, Condvar)>;

/// A client of the rendezvous store, and its server when this rank serves it.
#[derive(Debug)]
pub struct TcpStore {
    addr: SocketAddr,
    timeout: Duration,
    conn: Mutex<TcpStream>,
    server: Option<Server>,
    /// Prepended to every key (torch's `PrefixStore`).
    prefix: String,
}

#[derive(Debug)]
struct Server {
    /// Where the listener is bound (`0.0.0.0:PORT` on every interface).
    listen: SocketAddr,
    /// A connectable address of the listener (loopback for `0.0.0.0`).
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so that it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

fn store_err(op: &str, msg: impl Into<String>) -> ember_autograd::Error {
    dist_error(ErrorKind::Distributed, None, format!("TCPStore.{op}"), msg)
}

fn io_err(op: &str, addr: SocketAddr, e: std::io::Error) -> ember_autograd::Error {
    use std::io::ErrorKind as K;
    let msg = match e.kind() {
        K::UnexpectedEof | K::ConnectionReset | K::BrokenPipe | K::ConnectionAborted => format!(
            "the store at {addr} closed the connection ({e}): the process that serves it (rank 0, or `ember launch` on node 0) has ended"
        ),
        K::WouldBlock | K::TimedOut => {
            format!("the store at {addr} did not answer in time ({e})")
        }
        _ => format!("the connection to the store at {addr} failed: {e}"),
    };
    store_err(op, msg)
}

impl TcpStore {
    /// Connects to the store at `host:port`, first serving it on every interface at `port`
    /// if `is_server` (Note [Store binding]; port 0 picks a free port: see
    /// [`TcpStore::addr`]). Connecting retries until `timeout`, then fails naming the
    /// address.
    pub fn new(host: &str, port: u16, is_server: bool, timeout: Duration) -> Result<TcpStore> {
        let target = resolve(host, port)?;
        if is_server {
            let server = listen(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port))?;
            // The server answers on every interface; its own client goes to the address
            // asked for, on the port bound.
            let addr = SocketAddr::new(target.ip(), server.addr.port());
            return TcpStore::client_of(addr, timeout, Some(server));
        }
        TcpStore::client_of(target, timeout, None)
    }

    /// Serves the store on `bind` alone (one interface; port 0 picks a free port) and
    /// connects to it.
    pub fn serve(bind: SocketAddr, timeout: Duration) -> Result<TcpStore> {
        let server = listen(bind)?;
        let ip = match server.addr.ip() {
            ip if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            ip => ip,
        };
        TcpStore::client_of(
            SocketAddr::new(ip, server.addr.port()),
            timeout,
            Some(server),
        )
    }

    fn client_of(addr: SocketAddr, timeout: Duration, server: Option<Server>) -> Result<TcpStore> {
        let conn = connect(addr, timeout)?;
        Ok(TcpStore {
            addr,
            timeout,
            conn: Mutex::new(conn),
            server,
            prefix: String::new(),
        })
    }

    /// The same store with every key prefixed by `prefix` (torch's `PrefixStore`).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> TcpStore {
        self.prefix = prefix.into();
        self
    }

    /// The key prefix ([`TcpStore::with_prefix`]; empty by default).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The store's address (the bound one when this store serves on port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address the server listens on (`0.0.0.0:PORT` unless bound to one interface);
    /// `None` for a client.
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.server.as_ref().map(|s| s.listen)
    }

    /// `true` if this process serves the store.
    pub fn is_server(&self) -> bool {
        self.server.is_some()
    }

    /// How long `get` waits and connecting retries.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets `key` to `value`, waking the ranks waiting for it.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let mut req = self.request(OP_SET, key);
        req.extend_from_slice(&(value.len() as u64).to_le_bytes());
        req.extend_from_slice(value);
        self.call("set", &req, Duration::ZERO).map(|_| ())
    }

    /// The value of `key`, waiting (at most the store's timeout) until some rank sets it.
    pub fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.get_within(key, self.timeout)
    }

    /// The value of `key`, waiting at most `wait` until some rank sets it.
    pub fn get_within(&self, key: &str, wait: Duration) -> Result<Vec<u8>> {
        self.wait_for(key, wait)?.ok_or_else(|| {
            store_err(
                "get",
                format!(
                    "key {key:?} was not set within {wait:?} (the store at {})",
                    self.addr
                ),
            )
        })
    }

    /// The value of `key`, or `None` when no rank set it within `wait`.
    pub fn wait_for(&self, key: &str, wait: Duration) -> Result<Option<Vec<u8>>> {
        let mut req = self.request(OP_GET, key);
        let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        req.extend_from_slice(&ms.to_le_bytes());
        let (status, v) = self.call("get", &req, wait)?;
        Ok((status == STATUS_OK).then_some(v))
    }

    /// Whether every key of `keys` is set, without waiting (torch's `TCPStore.check`).
    pub fn check(&self, keys: &[&str]) -> Result<bool> {
        for key in keys {
            let req = self.request(OP_CHECK, key);
            let (status, _) = self.call("check", &req, Duration::ZERO)?;
            if status != STATUS_OK {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Adds `delta` to the counter `key` (0 if unset) and returns the new value.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let mut req = self.request(OP_ADD, key);
        req.extend_from_slice(&delta.to_le_bytes());
        let (_, v) = self.call("add", &req, Duration::ZERO)?;
        let b: [u8; 8] = v
            .as_slice()
            .try_into()
            .map_err(|_| store_err("add", "the store replied with a malformed counter"))?;
        Ok(i64::from_le_bytes(b))
    }

    /// Sends `req` and reads the reply, which the server sends within `wait` (a `get`'s
    /// wait; zero for the others) plus a margin: never longer.
    fn call(&self, op: &str, req: &[u8], wait: Duration) -> Result<(u8, Vec<u8>)> {
        let mut conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = conn.set_read_timeout(Some(wait + self.timeout.min(REPLY_MARGIN)));
        conn.write_all(req).map_err(|e| io_err(op, self.addr, e))?;
        let mut status = [0u8; 1];
        conn.read_exact(&mut status)
            .map_err(|e| io_err(op, self.addr, e))?;
        let v = read_bytes(&mut *conn).map_err(|e| io_err(op, self.addr, e))?;
        Ok((status[0], v))
    }

    fn request(&self, op: u8, key: &str) -> Vec<u8> {
        let key = format!("{}{key}", self.prefix);
        let mut r = vec![op];
        r.extend_from_slice(&(key.len() as u32).to_le_bytes());
        r.extend_from_slice(key.as_bytes());
        r
    }
}

/// How long past its own wait a reply may take (a busy server, a slow network) before the
/// client gives up; the store's timeout when shorter.
const REPLY_MARGIN: Duration = Duration::from_secs(5);

fn resolve(host: &str, port: u16) -> Result<SocketAddr> {
    (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| {
            store_err(
                "connect",
                format!("cannot resolve MASTER_ADDR {host:?} (port {port})"),
            )
        })
}

fn connect(addr: SocketAddr, timeout: Duration) -> Result<TcpStream> {
    let start = Instant::now();
    loop {
        let left = timeout.saturating_sub(start.elapsed());
        match TcpStream::connect_timeout(&addr, left.max(Duration::from_millis(10))) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) if start.elapsed() >= timeout => {
                return Err(store_err(
                    "connect",
                    format!(
                        "cannot reach the rendezvous store at {addr} within {timeout:?}: {e} (check MASTER_ADDR and MASTER_PORT, and that rank 0 is running)"
                    ),
                ));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50).min(left)),
        }
    }
}

fn read_u64(r: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn read_bytes(r: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let n = read_u64(r)?;
    if n > MAX_LEN {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a length of {n} bytes is more than the store takes"),
        ));
    }
    let mut v = vec![0u8; n as usize];
    r.read_exact(&mut v)?;
    Ok(v)
}

fn listen(addr: SocketAddr) -> Result<Server> {
    let listener = TcpListener::bind(addr).map_err(|e| {
        store_err(
            "serve",
            format!(
                "the server socket has failed to listen on {addr} (MASTER_PORT {}): {e}",
                addr.port()
            ),
        )
    })?;
    let listen = listener
        .local_addr()
        .map_err(|e| io_err("serve", addr, e))?;
    let addr = match listen.ip() {
        ip if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), listen.port())
        }
        _ => listen,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let map: Map = Arc::new((Mutex::new(HashMap::new()), Condvar::new()));
    let flag = stop.clone();
    std::thread::Builder::new()
        .name("ember-store".into())
        .spawn(move || {
            for conn in listener.incoming() {
                if flag.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let map = map.clone();
                let _ = std::thread::Builder::new()
                    .name("ember-store-conn".into())
                    .spawn(move || {
                        let _ = handle(conn, &map);
                    });
            }
        })
        .map_err(|e| store_err("serve", format!("cannot start the store's thread: {e}")))?;
    Ok(Server { listen, addr, stop })
}

/// Serves one client until it disconnects.
fn handle(mut conn: TcpStream, map: &Map) -> std::io::Result<()> {
    let _ = conn.set_nodelay(true);
    let (lock, cv) = &**map;
    loop {
        let mut op = [0u8; 1];
        if conn.read_exact(&mut op).is_err() {
            return Ok(());
        }
        let mut kl = [0u8; 4];
        conn.read_exact(&mut kl)?;
        let kl = u64::from(u32::from_le_bytes(kl));
        if kl > MAX_LEN {
            return Ok(());
        }
        let mut key = vec![0u8; kl as usize];
        conn.read_exact(&mut key)?;
        let key = String::from_utf8_lossy(&key).into_owned();
        let (status, value) = match op[0] {
            OP_SET => {
                let v = read_bytes(&mut conn)?;
                lock.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(key, v);
                cv.notify_all();
                (STATUS_OK, Vec::new())
            }
            OP_GET => {
                let wait = Duration::from_millis(read_u64(&mut conn)?);
                let deadline = Instant::now() + wait;
                let mut g = lock.lock().unwrap_or_else(PoisonError::into_inner);
                loop {
                    if let Some(v) = g.get(&key) {
                        break (STATUS_OK, v.clone());
                    }
                    let now = Instant::now();
                    if now >= deadline {
                        break (STATUS_TIMEOUT, Vec::new());
                    }
                    g = cv
                        .wait_timeout(g, deadline - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
            }
            OP_CHECK => {
                let g = lock.lock().unwrap_or_else(PoisonError::into_inner);
                let status = if g.contains_key(&key) {
                    STATUS_OK
                } else {
                    STATUS_TIMEOUT
                };
                (status, Vec::new())
            }
            OP_ADD => {
                let mut d = [0u8; 8];
                conn.read_exact(&mut d)?;
                let delta = i64::from_le_bytes(d);
                let mut g = lock.lock().unwrap_or_else(PoisonError::into_inner);
                let cur = g
                    .get(&key)
                    .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
                    .map_or(0, i64::from_le_bytes);
                let new = cur.wrapping_add(delta);
                g.insert(key, new.to_le_bytes().to_vec());
                drop(g);
                cv.notify_all();
                (STATUS_OK, new.to_le_bytes().to_vec())
            }
            _ => return Ok(()),
        };
        let mut reply = vec![status];
        reply.extend_from_slice(&(value.len() as u64).to_le_bytes());
        reply.extend_from_slice(&value);
        conn.write_all(&reply)?;
    }
}
