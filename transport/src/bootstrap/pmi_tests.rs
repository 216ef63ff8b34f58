//! The PMI-1 client against in-test launchers: a faithful one serving several processes (KVS,
//! barrier) and hostile ones (wrong, failed, overlong, missing replies).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use super::*;

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

/// Serves one process like hydra: the replies of the module documentation, a KVS shared by
/// all processes, `barrier_out` once all of them entered. Returns the requests it saw.
fn serve(
    s: UnixStream,
    kvs: Arc<Mutex<HashMap<String, String>>>,
    barrier: Arc<Barrier>,
) -> Vec<String> {
    let mut out = s.try_clone().unwrap();
    let mut seen = Vec::new();
    for line in BufReader::new(s).lines() {
        let Ok(line) = line else { break };
        seen.push(line.clone());
        let f = parse_line(&line);
        let reply = match f["cmd"].as_str() {
            "init" => "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0".into(),
            "get_maxes" => "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024 rc=0".into(),
            "get_my_kvsname" => "cmd=my_kvsname kvsname=kvs_42_0 rc=0".into(),
            "put" => {
                assert_eq!(f["kvsname"], "kvs_42_0");
                kvs.lock()
                    .unwrap()
                    .insert(f["key"].clone(), f["value"].clone());
                "cmd=put_result rc=0".into()
            }
            "barrier_in" => {
                barrier.wait();
                "cmd=barrier_out".into()
            }
            "get" => match kvs.lock().unwrap().get(&f["key"]) {
                Some(v) => format!("cmd=get_result rc=0 value={v}"),
                None => "cmd=get_result rc=-1 msg=key_not_found".into(),
            },
            "finalize" => "cmd=finalize_ack".into(),
            c => panic!("unexpected command {c}"),
        };
        out.write_all(format!("{reply}\n").as_bytes()).unwrap();
    }
    seen
}

#[test]
fn put_barrier_get_between_three_processes() {
    let n = 3;
    let kvs = Arc::new(Mutex::new(HashMap::new()));
    let barrier = Arc::new(Barrier::new(n));
    let (servers, clients): (Vec<_>, Vec<_>) = (0..n)
        .map(|_| {
            let (a, b) = UnixStream::pair().unwrap();
            let (kvs, barrier) = (kvs.clone(), barrier.clone());
            (std::thread::spawn(move || serve(a, kvs, barrier)), b)
        })
        .unzip();
    let got: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(rank, c)| {
                s.spawn(move || {
                    let mut p = Pmi::init(c, deadline()).unwrap();
                    assert_eq!(p.kvsname(), "kvs_42_0");
                    if rank == 0 {
                        p.put("ampccl-uid-0", &"ab".repeat(128), deadline())
                            .unwrap();
                    }
                    p.barrier(deadline()).unwrap();
                    let v = p.get("ampccl-uid-0", deadline()).unwrap();
                    assert!(matches!(
                        p.get("missing", deadline()),
                        Err(Error::Remote(m)) if m.contains("rc=-1") && m.contains("key_not_found")
                    ));
                    p.finalize(deadline()).unwrap();
                    v
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(got.iter().all(|v| *v == "ab".repeat(128)));
    let seen = servers.into_iter().next().unwrap().join().unwrap();
    assert_eq!(seen[0], "cmd=init pmi_version=1 pmi_subversion=1");
    assert_eq!(seen[1], "cmd=get_maxes");
    assert_eq!(seen[2], "cmd=get_my_kvsname");
    assert_eq!(
        seen[3],
        format!(
            "cmd=put kvsname=kvs_42_0 key=ampccl-uid-0 value={}",
            "ab".repeat(128)
        )
    );
    assert_eq!(seen.last().unwrap(), "cmd=finalize");
}

/// A launcher that answers the `init` handshake normally and then every request with `reply`
/// (raw bytes, `None`: silence); `maxes` replaces the `get_maxes` reply.
fn hostile(maxes: &str, reply: Option<Vec<u8>>) -> UnixStream {
    let (a, b) = UnixStream::pair().unwrap();
    let maxes = maxes.to_owned();
    std::thread::spawn(move || {
        let mut out = a.try_clone().unwrap();
        for line in BufReader::new(a).lines() {
            let Ok(line) = line else { break };
            let r: Vec<u8> = match parse_line(&line)["cmd"].as_str() {
                "init" => b"cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n".to_vec(),
                "get_maxes" => format!("{maxes}\n").into_bytes(),
                "get_my_kvsname" => b"cmd=my_kvsname kvsname=k rc=0\n".to_vec(),
                _ => match &reply {
                    Some(r) => r.clone(),
                    None => {
                        std::thread::sleep(Duration::from_secs(5));
                        return;
                    }
                },
            };
            if out.write_all(&r).is_err() {
                return;
            }
        }
    });
    b
}

const MAXES: &str = "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024 rc=0";

#[test]
fn hostile_launchers_are_clear_errors() {
    let remote = |r: Result<()>, needle: &str| match r {
        Err(Error::Remote(m)) => assert!(m.contains(needle), "{m} should say {needle}"),
        other => panic!("expected a remote error saying {needle}, got {other:?}"),
    };
    // Maxima missing or zero.
    remote(
        Pmi::init(hostile("cmd=maxes rc=0", None), deadline()).map(drop),
        "keylen_max",
    );
    remote(
        Pmi::init(
            hostile("cmd=maxes kvsname_max=9 keylen_max=0 vallen_max=9", None),
            deadline(),
        )
        .map(drop),
        "keylen_max",
    );
    // A reply to another command; a failure code.
    let mut p = Pmi::init(
        hostile(MAXES, Some(b"cmd=get_result rc=0\n".to_vec())),
        deadline(),
    )
    .unwrap();
    remote(p.barrier(deadline()), "expected cmd=barrier_out");
    let mut p = Pmi::init(
        hostile(MAXES, Some(b"cmd=put_result rc=3 msg=full\n".to_vec())),
        deadline(),
    )
    .unwrap();
    remote(p.put("k", "v", deadline()), "rc=3 (full)");
    // An endless line without a newline: refused once past MAX_LINE.
    let mut p = Pmi::init(hostile(MAXES, Some(vec![b'x'; 4 * MAX_LINE])), deadline()).unwrap();
    remote(p.barrier(deadline()), "longer than");
    // A get_result without a value.
    let mut p = Pmi::init(
        hostile(MAXES, Some(b"cmd=get_result rc=0\n".to_vec())),
        deadline(),
    )
    .unwrap();
    assert!(matches!(p.get("k", deadline()), Err(Error::Remote(m)) if m.contains("no value")));
    // The launcher closes the socket.
    let (a, b) = UnixStream::pair().unwrap();
    drop(a);
    remote(Pmi::init(b, deadline()).map(drop), "");
    // Silence: the deadline holds.
    let mut p = Pmi::init(hostile(MAXES, None), deadline()).unwrap();
    let t = Instant::now();
    let e = p
        .barrier(Instant::now() + Duration::from_millis(300))
        .unwrap_err();
    assert!(matches!(e, Error::Timeout(_)), "{e}");
    assert!(t.elapsed() < Duration::from_secs(3));
    // Keys and values the format cannot carry, or longer than the launcher's maxima.
    let mut p = Pmi::init(
        hostile(MAXES, Some(b"cmd=put_result rc=0\n".to_vec())),
        deadline(),
    )
    .unwrap();
    for (k, v) in [("a b", "v"), ("k", "x=y"), ("k", ""), ("k", "a\nb")] {
        assert!(
            matches!(p.put(k, v, deadline()), Err(Error::InvalidArgument(_))),
            "{k:?} {v:?}"
        );
    }
    assert!(matches!(
        p.put(&"k".repeat(65), "v", deadline()),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        p.put("k", &"v".repeat(1025), deadline()),
        Err(Error::InvalidArgument(_))
    ));
    p.put("k", &"v".repeat(1024), deadline()).unwrap();
}
