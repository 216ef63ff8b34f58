//! The TCPStore client against in-test servers: a small faithful store (the protocol of the
//! module documentation) and hostile ones (short, oversized, wrong and missing replies).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::*;

const T: Duration = Duration::from_secs(10);

fn deadline() -> Instant {
    Instant::now() + T
}

#[derive(Default)]
pub(crate) struct Kv {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
    /// Whether every connection started with a valid VALIDATE.
    validated: Mutex<Vec<bool>>,
}

fn read_u64(s: &mut TcpStream) -> Option<u64> {
    let mut b = [0u8; 8];
    s.read_exact(&mut b).ok()?;
    Some(u64::from_le_bytes(b))
}

fn read_str(s: &mut TcpStream) -> Option<String> {
    let n = read_u64(s)?;
    assert!(n <= MAX_KEY as u64 * 1024, "client sent a {n}-byte string");
    let mut b = vec![0u8; n as usize];
    s.read_exact(&mut b).ok()?;
    Some(String::from_utf8_lossy(&b).into_owned())
}

fn reply_bytes(s: &mut TcpStream, v: &[u8]) {
    let _ = s.write_all(&(v.len() as u64).to_le_bytes());
    let _ = s.write_all(v);
}

/// Serves one connection like a TCPStore until it closes.
fn serve(mut s: TcpStream, kv: Arc<Kv>) {
    let mut q = [0u8; 1];
    let mut first = true;
    while s.read_exact(&mut q).is_ok() {
        if first {
            let mut m = [0u8; 4];
            let ok = q[0] == Q_VALIDATE
                && s.read_exact(&mut m).is_ok()
                && u32::from_le_bytes(m) == VALIDATE_MAGIC;
            kv.validated.lock().unwrap().push(ok);
            if !ok {
                return;
            }
            first = false;
            continue;
        }
        let Some(()) = (|| {
            match q[0] {
                Q_SET => {
                    let k = read_str(&mut s)?;
                    let n = read_u64(&mut s)?;
                    let mut v = vec![0u8; n as usize];
                    s.read_exact(&mut v).ok()?;
                    kv.map.lock().unwrap().insert(k, v);
                    kv.changed.notify_all();
                }
                Q_GET => {
                    let k = read_str(&mut s)?;
                    let v = kv.map.lock().unwrap().get(&k).cloned().unwrap_or_default();
                    reply_bytes(&mut s, &v);
                }
                Q_ADD => {
                    let k = read_str(&mut s)?;
                    let mut d = [0u8; 8];
                    s.read_exact(&mut d).ok()?;
                    let mut map = kv.map.lock().unwrap();
                    let old: i64 = map
                        .get(&k)
                        .map_or(0, |v| String::from_utf8_lossy(v).parse().unwrap());
                    let new = old + i64::from_le_bytes(d);
                    map.insert(k, new.to_string().into_bytes());
                    let _ = s.write_all(&new.to_le_bytes());
                }
                Q_CHECK | Q_WAIT => {
                    let n = read_u64(&mut s)?;
                    let keys: Vec<String> =
                        (0..n).map(|_| read_str(&mut s)).collect::<Option<_>>()?;
                    let mut map = kv.map.lock().unwrap();
                    let ready =
                        |m: &HashMap<String, Vec<u8>>| keys.iter().all(|k| m.contains_key(k));
                    if q[0] == Q_CHECK {
                        let _ = s.write_all(&[if ready(&map) { READY } else { NOT_READY }]);
                    } else {
                        while !ready(&map) {
                            map = kv.changed.wait(map).unwrap();
                        }
                        let _ = s.write_all(&[READY]);
                    }
                }
                Q_PING => {
                    let mut n = [0u8; 4];
                    s.read_exact(&mut n).ok()?;
                    let _ = s.write_all(&n);
                }
                _ => return None,
            }
            Some(())
        })() else {
            return;
        };
    }
}

/// A faithful store on an ephemeral port: (port, its state).
pub(crate) fn store() -> (u16, Arc<Kv>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let kv = Arc::new(Kv::default());
    let k2 = kv.clone();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let kv = k2.clone();
            std::thread::spawn(move || serve(s, kv));
        }
    });
    (port, kv)
}

#[test]
fn set_get_add_check_wait_ping_against_a_store() {
    let (port, kv) = store();
    let mut a = StoreClient::connect("localhost", port, deadline()).unwrap();
    let mut b = StoreClient::connect("127.0.0.1", port, deadline()).unwrap();
    assert!(a.local_ip().unwrap().is_loopback());
    b.ping(deadline()).unwrap();
    assert!(!b.check(&["k"], deadline()).unwrap());
    assert_eq!(b.get("k", deadline()).unwrap(), b"");
    let waiter = std::thread::spawn(move || {
        let t = Instant::now();
        b.wait(&["k", "k2"], deadline()).unwrap();
        (b.get("k", deadline()).unwrap(), t.elapsed())
    });
    std::thread::sleep(Duration::from_millis(200));
    a.set("k", b"value one", deadline()).unwrap();
    a.set("k2", b"", deadline()).unwrap();
    let (v, waited) = waiter.join().unwrap();
    assert_eq!(v, b"value one");
    assert!(waited >= Duration::from_millis(150), "wait returned early");
    assert_eq!(a.add("n", 5, deadline()).unwrap(), 5);
    assert_eq!(a.add("n", -2, deadline()).unwrap(), 3);
    assert!(a.check(&["k", "n"], deadline()).unwrap());
    assert!(kv.validated.lock().unwrap().iter().all(|&v| v));
    assert_eq!(kv.validated.lock().unwrap().len(), 2);
    let long = "x".repeat(MAX_KEY + 1);
    assert!(matches!(
        a.set(&long, b"", deadline()),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn wait_honours_its_deadline() {
    let (port, _kv) = store();
    let mut c = StoreClient::connect("127.0.0.1", port, deadline()).unwrap();
    let t = Instant::now();
    let e = c
        .wait(&["never"], Instant::now() + Duration::from_millis(300))
        .unwrap_err();
    assert!(
        matches!(&e, Error::Timeout(m) if m.contains("never")),
        "{e}"
    );
    assert!(t.elapsed() < Duration::from_secs(3));
}

#[test]
fn connect_retries_until_the_store_is_up_and_times_out_without_one() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let t = Instant::now();
    let e = StoreClient::connect(
        "127.0.0.1",
        port,
        Instant::now() + Duration::from_millis(400),
    )
    .unwrap_err();
    assert!(
        matches!(&e, Error::Timeout(m) if m.contains("unreachable")),
        "{e}"
    );
    assert!(t.elapsed() >= Duration::from_millis(350));
    assert!(matches!(
        StoreClient::connect("no-such-host.invalid", 1, deadline()),
        Err(Error::InvalidArgument(_))
    ));
}

/// A server that validates, then answers every request with `reply` and closes (or, with
/// `reply = None`, stays silent).
fn hostile(reply: Option<Vec<u8>>) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let reply = reply.clone();
            std::thread::spawn(move || {
                let mut hdr = [0u8; 5];
                if s.read_exact(&mut hdr).is_err() {
                    return;
                }
                let mut buf = [0u8; 256];
                let _ = s.read(&mut buf);
                match reply {
                    Some(r) => {
                        let _ = s.write_all(&r);
                    }
                    None => std::thread::sleep(Duration::from_secs(5)),
                }
            });
        }
    });
    port
}

#[test]
fn hostile_replies_are_clear_errors() {
    let short = Instant::now() + Duration::from_millis(500);
    // A length far beyond MAX_VALUE: refused before allocating.
    let mut c = StoreClient::connect(
        "127.0.0.1",
        hostile(Some(u64::MAX.to_le_bytes().to_vec())),
        deadline(),
    )
    .unwrap();
    let e = c.get("k", deadline()).unwrap_err();
    assert!(
        matches!(&e, Error::Remote(m) if m.contains("more than")),
        "{e}"
    );
    // A truncated reply: the length promises 100 bytes, 3 arrive, then EOF.
    let mut r = 100u64.to_le_bytes().to_vec();
    r.extend_from_slice(b"abc");
    let mut c = StoreClient::connect("127.0.0.1", hostile(Some(r)), deadline()).unwrap();
    let e = c.get("k", deadline()).unwrap_err();
    assert!(
        matches!(&e, Error::Remote(m) if m.contains("closed")),
        "{e}"
    );
    // A half length.
    let mut c =
        StoreClient::connect("127.0.0.1", hostile(Some(vec![1, 2, 3])), deadline()).unwrap();
    assert!(matches!(c.add("k", 1, deadline()), Err(Error::Remote(_))));
    // A wait answered with something that is not STOP_WAITING.
    let mut c = StoreClient::connect("127.0.0.1", hostile(Some(vec![7])), deadline()).unwrap();
    let e = c.wait(&["k"], deadline()).unwrap_err();
    assert!(
        matches!(&e, Error::Remote(m) if m.contains("unexpected reply byte 7")),
        "{e}"
    );
    let mut c = StoreClient::connect("127.0.0.1", hostile(Some(vec![9])), deadline()).unwrap();
    assert!(matches!(c.check(&["k"], deadline()), Err(Error::Remote(_))));
    // A wrong ping echo.
    let mut c = StoreClient::connect("127.0.0.1", hostile(Some(vec![0; 4])), deadline()).unwrap();
    assert!(matches!(c.ping(deadline()), Err(Error::Remote(m)) if m.contains("ping")));
    // Silence: the deadline holds.
    let mut c = StoreClient::connect("127.0.0.1", hostile(None), deadline()).unwrap();
    let t = Instant::now();
    assert!(matches!(c.get("k", short), Err(Error::Timeout(_))));
    assert!(t.elapsed() < Duration::from_secs(3));
}
