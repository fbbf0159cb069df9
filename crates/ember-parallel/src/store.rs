//! [`TcpStore`]: the rendezvous key-value store on `MASTER_ADDR:MASTER_PORT`, as torchrun's
//! `TCPStore`: rank 0 serves it, every rank (rank 0 included) is a client. `set`, `get`
//! (waits until the key exists, at most the store's timeout) and `add` (an atomic counter).
//! The `nccl` backend exchanges NCCL's unique id through it; it moves a few bytes once, so
//! it is a thread per connection over blocking sockets.
//!
//! Wire format, little-endian: a request is `op: u8`, `key_len: u32`, `key`, then for `set`
//! `value_len: u64` and `value`, for `get` `timeout_ms: u64`, for `add` `delta: i64`. A
//! reply is `status: u8` (0 ok, 1 timed out) and `value_len: u64`, `value` (`add` replies
//! with the new count as 8 bytes).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ember_autograd::{ErrorKind, Result};

use crate::error::dist_error;

const OP_SET: u8 = 1;
const OP_GET: u8 = 2;
const OP_ADD: u8 = 3;
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
}

#[derive(Debug)]
struct Server {
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
    store_err(
        op,
        format!("the connection to the store at {addr} failed: {e}"),
    )
}

impl TcpStore {
    /// Connects to the store at `host:port`, first serving it there if `is_server` (port 0
    /// picks a free port: see [`TcpStore::addr`]). Connecting retries until `timeout`, then
    /// fails naming the address.
    pub fn new(host: &str, port: u16, is_server: bool, timeout: Duration) -> Result<TcpStore> {
        let target = (host, port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| {
                store_err(
                    "connect",
                    format!("cannot resolve MASTER_ADDR {host:?} (port {port})"),
                )
            })?;
        let server = if is_server {
            Some(serve(target)?)
        } else {
            None
        };
        let addr = server.as_ref().map_or(target, |s| s.addr);
        let conn = connect(addr, timeout)?;
        Ok(TcpStore {
            addr,
            timeout,
            conn: Mutex::new(conn),
            server,
        })
    }

    /// The store's address (the bound one when this store serves on port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
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
        let mut req = request(OP_SET, key);
        req.extend_from_slice(&(value.len() as u64).to_le_bytes());
        req.extend_from_slice(value);
        self.call("set", &req).map(|_| ())
    }

    /// The value of `key`, waiting (at most the store's timeout) until some rank sets it.
    pub fn get(&self, key: &str) -> Result<Vec<u8>> {
        let mut req = request(OP_GET, key);
        let ms = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
        req.extend_from_slice(&ms.to_le_bytes());
        self.call("get", &req).and_then(|(status, v)| {
            if status == STATUS_TIMEOUT {
                Err(store_err(
                    "get",
                    format!(
                        "key {key:?} was not set within {:?} (the store at {})",
                        self.timeout, self.addr
                    ),
                ))
            } else {
                Ok(v)
            }
        })
    }

    /// Adds `delta` to the counter `key` (0 if unset) and returns the new value.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let mut req = request(OP_ADD, key);
        req.extend_from_slice(&delta.to_le_bytes());
        let (_, v) = self.call("add", &req)?;
        let b: [u8; 8] = v
            .as_slice()
            .try_into()
            .map_err(|_| store_err("add", "the store replied with a malformed counter"))?;
        Ok(i64::from_le_bytes(b))
    }

    fn call(&self, op: &str, req: &[u8]) -> Result<(u8, Vec<u8>)> {
        let mut conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        // A reply may take the server's wait plus a margin; never longer.
        let _ = conn.set_read_timeout(Some(self.timeout + Duration::from_secs(5)));
        conn.write_all(req).map_err(|e| io_err(op, self.addr, e))?;
        let mut status = [0u8; 1];
        conn.read_exact(&mut status)
            .map_err(|e| io_err(op, self.addr, e))?;
        let v = read_bytes(&mut *conn).map_err(|e| io_err(op, self.addr, e))?;
        Ok((status[0], v))
    }
}

fn request(op: u8, key: &str) -> Vec<u8> {
    let mut r = vec![op];
    r.extend_from_slice(&(key.len() as u32).to_le_bytes());
    r.extend_from_slice(key.as_bytes());
    r
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

fn serve(addr: SocketAddr) -> Result<Server> {
    let listener = TcpListener::bind(addr).map_err(|e| {
        store_err(
            "serve",
            format!("cannot listen on {addr} (MASTER_ADDR:MASTER_PORT): {e}"),
        )
    })?;
    let bound = listener
        .local_addr()
        .map_err(|e| io_err("serve", addr, e))?;
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
    Ok(Server { addr: bound, stop })
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
