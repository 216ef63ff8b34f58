//! Tests of the environment configuration: parsing, the MASTER_ADDR rendezvous and its token.

use std::collections::HashMap;
use std::net::TcpListener;
use std::time::Duration;

use super::*;
use crate::bootstrap::Bootstrap;

const T: Duration = Duration::from_secs(20);

fn localhost() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn free_port() -> u16 {
    TcpListener::bind(localhost())
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn env(vars: &[(&str, String)]) -> impl Fn(&str) -> Option<String> + use<> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    move |k| map.get(k).cloned()
}

#[test]
fn from_env_master_mode() {
    let port = free_port().to_string();
    let world = 3;
    let results: Vec<(usize, usize, Vec<Vec<u8>>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let lookup = env(&[
                    ("MASTER_ADDR", "127.0.0.1".into()),
                    ("MASTER_PORT", port.clone()),
                    ("RANK", rank.to_string()),
                    ("WORLD_SIZE", world.to_string()),
                    ("LOCAL_RANK", (10 + rank).to_string()),
                ]);
                s.spawn(move || {
                    let bs = Bootstrap::from_lookup(lookup, T).unwrap();
                    let all = bs
                        .allgather(0, &vec![bs.rank() as u8; bs.rank() + 1])
                        .unwrap();
                    (bs.rank(), bs.local_rank(), all)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, (r, local, all)) in results.into_iter().enumerate() {
        assert_eq!((r, local), (rank, 10 + rank));
        assert_eq!(
            all,
            (0..world).map(|i| vec![i as u8; i + 1]).collect::<Vec<_>>()
        );
    }
}

#[test]
fn env_config_parsing() {
    let base = |extra: &[(&str, &str)]| {
        let mut v: Vec<(&str, String)> = vec![
            ("MASTER_ADDR", "10.0.0.1".into()),
            ("MASTER_PORT", "29500".into()),
            ("RANK", "1".into()),
            ("WORLD_SIZE", "4".into()),
        ];
        for (k, val) in extra {
            v.retain(|(kk, _)| kk != k);
            if !val.is_empty() {
                v.push((k, val.to_string()));
            }
        }
        EnvConfig::parse(env(&v))
    };
    let cfg = base(&[]).unwrap();
    assert_eq!((cfg.rank, cfg.world, cfg.local_rank), (1, 4, None));
    let Rendezvous::Master { token, .. } = cfg.rendezvous.clone() else {
        panic!()
    };
    let Rendezvous::Master { token: t2, .. } =
        base(&[("AMPCCL_TOKEN", "job7")]).unwrap().rendezvous
    else {
        panic!()
    };
    assert_ne!(token, t2);
    assert_eq!(base(&[]).unwrap(), cfg, "token is deterministic");
    // Launcher job ids key the token; the first of JOB_ID_VARS that is set wins, and
    // torchrun's default run id `none` is no job id.
    let token_of = |extra: &[(&str, &str)]| match base(extra).unwrap().rendezvous {
        Rendezvous::Master {
            token, job_id_from, ..
        } => (token, job_id_from),
        r => panic!("{r:?}"),
    };
    assert_eq!(token_of(&[]), (token, None));
    assert_eq!(token_of(&[("TORCHELASTIC_RUN_ID", "none")]), (token, None));
    for name in JOB_ID_VARS {
        let (t, from) = token_of(&[(name, "42")]);
        assert_ne!(t, token, "{name}");
        assert_eq!(from, Some(*name));
        assert_ne!(token_of(&[(name, "43")]).0, t, "{name}");
    }
    assert_eq!(
        token_of(&[("AMPCCL_TOKEN", "job7"), ("SLURM_JOB_ID", "9")]),
        (t2, Some("AMPCCL_TOKEN"))
    );
    assert_eq!(
        token_of(&[("TORCHELASTIC_RUN_ID", "none"), ("SLURM_JOB_ID", "9")]),
        token_of(&[("SLURM_JOB_ID", "9")])
    );
    let err_names = |extra: &[(&str, &str)], name: &str| match base(extra) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains(name), "{m} should name {name}"),
        other => panic!("expected InvalidArgument naming {name}, got {other:?}"),
    };
    err_names(&[("MASTER_ADDR", "")], "MASTER_ADDR");
    err_names(&[("MASTER_PORT", "")], "MASTER_PORT");
    err_names(&[("MASTER_PORT", "99999")], "MASTER_PORT");
    err_names(&[("RANK", "")], "RANK");
    err_names(&[("RANK", "one")], "RANK");
    err_names(&[("WORLD_SIZE", "")], "WORLD_SIZE");
    err_names(&[("WORLD_SIZE", "0")], "WORLD_SIZE");
    err_names(&[("WORLD_SIZE", "2147483647")], "WORLD_SIZE");
    err_names(&[("WORLD_SIZE", "65537")], "WORLD_SIZE");
    err_names(&[("LOCAL_RANK", "-1")], "LOCAL_RANK");
    err_names(&[("AMPCCL_UNIQUE_ID", "abcd")], "AMPCCL_UNIQUE_ID");
    // The AMPCCL_ variables win; a unique id replaces MASTER_*.
    let id = UniqueId::new("127.0.0.1:5".parse().unwrap(), 99);
    let cfg = base(&[
        ("AMPCCL_UNIQUE_ID", &id.to_hex()),
        ("AMPCCL_RANK", "3"),
        ("MASTER_ADDR", ""),
    ])
    .unwrap();
    assert_eq!((cfg.rank, cfg.rendezvous), (3, Rendezvous::UniqueId(id)));
    let bad = base(&[("RANK", "4")]).unwrap();
    assert!(matches!(
        Bootstrap::from_config(&bad, T),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        timeout_from(&env(&[("AMPCCL_TIMEOUT_S", "0".into())])),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(
        timeout_from(&env(&[("AMPCCL_TIMEOUT_S", "1.5".into())])).unwrap(),
        Duration::from_millis(1500)
    );
    assert_eq!(timeout_from(&env(&[])).unwrap(), DEFAULT_TIMEOUT);
    for bad in ["1e19", "-1", "nan", "inf", "soon", "1000001"] {
        let e = timeout_from(&env(&[("AMPCCL_TIMEOUT_S", bad.into())]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("AMPCCL_TIMEOUT_S") && e.contains("(0, 1000000]"),
            "{e}"
        );
    }
    assert_eq!(
        timeout_from(&env(&[("AMPCCL_TIMEOUT_S", "1e6".into())])).unwrap(),
        Duration::from_secs(1_000_000)
    );
    assert!(bootstrap_addr_from(&env(&[("AMPCCL_BOOTSTRAP_ADDR", "nope".into())])).is_err());
    assert_eq!(
        bootstrap_addr_from(&env(&[("AMPCCL_BOOTSTRAP_ADDR", "::1".into())])).unwrap(),
        "[::1]:0".parse().unwrap()
    );
}

#[test]
fn from_env_unique_id_mode() {
    let (id, _root) = UniqueId::generate_with(localhost(), T).unwrap();
    let hex = id.to_hex();
    let ranks: Vec<usize> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let lookup = env(&[
                    ("AMPCCL_UNIQUE_ID", hex.clone()),
                    ("AMPCCL_RANK", r.to_string()),
                    ("RANK", "7".into()),
                    ("WORLD_SIZE", "2".into()),
                ]);
                s.spawn(move || Bootstrap::from_lookup(lookup, T).unwrap().rank())
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(ranks, [0, 1]);
}

/// Rank 0's root must be up before the rest of a test goes on.
fn wait_for_root(port: u16) {
    let t = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t.elapsed() < T, "root on port {port} never came up");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn master_mode_binds_master_addr_not_the_wildcard() {
    let port = free_port();
    let rank = |r: usize| {
        env(&[
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("MASTER_PORT", port.to_string()),
            ("RANK", r.to_string()),
            ("WORLD_SIZE", "2".into()),
        ])
    };
    std::thread::scope(|s| {
        let r0 = s.spawn(|| Bootstrap::from_lookup(rank(0), T).unwrap());
        wait_for_root(port);
        // Another address of this host (all of 127/8 is loopback) does not reach the root.
        let other = std::net::TcpStream::connect(("127.0.0.2", port));
        assert!(other.is_err(), "the root listens beyond MASTER_ADDR");
        let r1 = Bootstrap::from_lookup(rank(1), T).unwrap();
        let r0 = r0.join().unwrap();
        assert_eq!((r0.rank(), r1.rank()), (0, 1));
    });
}

#[test]
fn jobs_sharing_a_port_never_form_one_communicator() {
    for id_var in ["SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "PMIX_NAMESPACE"] {
        let port = free_port();
        let rank = |job: &str, r: usize| {
            env(&[
                ("MASTER_ADDR", "127.0.0.1".into()),
                ("MASTER_PORT", port.to_string()),
                ("RANK", r.to_string()),
                ("WORLD_SIZE", "2".into()),
                (id_var, job.into()),
            ])
        };
        std::thread::scope(|s| {
            let a0 = s.spawn(|| Bootstrap::from_lookup(rank("job-a", 0), T));
            wait_for_root(port);
            // Job B's rank 1 reaches job A's root: refused, and told why.
            let start = std::time::Instant::now();
            let e = Bootstrap::from_lookup(rank("job-b", 1), T).unwrap_err();
            assert!(
                matches!(&e, Error::InvalidUsage(m) if m.contains("wrong token")
                    && m.contains("another job") && m.contains(id_var)),
                "{id_var}: {e}"
            );
            assert!(start.elapsed() < Duration::from_secs(2), "{id_var}");
            // Job B's rank 0 cannot host a second root on the port.
            let e = Bootstrap::from_lookup(rank("job-b", 0), T).unwrap_err();
            assert!(
                matches!(&e, Error::InvalidUsage(m) if m.contains("already in use")),
                "{id_var}: {e}"
            );
            // Job A forms its communicator undisturbed.
            let a1 = Bootstrap::from_lookup(rank("job-a", 1), T).unwrap();
            let a0 = a0.join().unwrap().unwrap();
            s.spawn(move || a0.barrier(1).unwrap());
            a1.barrier(1).unwrap();
        });
    }
}

#[test]
fn launcher_environments_parse() {
    let torchrun = env(&[
        ("MASTER_ADDR", "localhost".into()),
        ("MASTER_PORT", "29500".into()),
        ("RANK", "1".into()),
        ("WORLD_SIZE", "2".into()),
        ("LOCAL_RANK", "1".into()),
        ("TORCHELASTIC_RUN_ID", "run7".into()),
        ("TORCHELASTIC_RESTART_COUNT", "2".into()),
        ("TORCHELASTIC_USE_AGENT_STORE", "True".into()),
    ]);
    let cfg = EnvConfig::parse(torchrun).unwrap();
    assert_eq!((cfg.rank, cfg.world, cfg.local_rank), (1, 2, Some(1)));
    assert_eq!(
        cfg.rendezvous,
        Rendezvous::TcpStore {
            addr: "localhost".into(),
            port: 29500,
            scope: "ampccl/run7/2".into()
        }
    );
    // Under PMI the launcher's numbering wins over a stray RANK; hydra's local rank is used.
    let hydra = env(&[
        ("PMI_FD", "11".into()),
        ("PMI_RANK", "3".into()),
        ("PMI_SIZE", "4".into()),
        ("RANK", "0".into()),
        ("MPI_LOCALRANKID", "1".into()),
        ("MPI_LOCALNRANKS", "2".into()),
    ]);
    let cfg = EnvConfig::parse(hydra).unwrap();
    assert_eq!((cfg.rank, cfg.world, cfg.local_rank), (3, 4, Some(1)));
    assert_eq!(
        cfg.rendezvous,
        Rendezvous::Pmi {
            fd: "11".into(),
            local_world: Some(2)
        }
    );
    // Open MPI with MASTER_ADDR: its numbering.
    let ompi = env(&[
        ("MASTER_ADDR", "10.0.0.1".into()),
        ("MASTER_PORT", "29500".into()),
        ("OMPI_COMM_WORLD_RANK", "2".into()),
        ("OMPI_COMM_WORLD_SIZE", "3".into()),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "0".into()),
    ]);
    let cfg = EnvConfig::parse(ompi).unwrap();
    assert_eq!((cfg.rank, cfg.world, cfg.local_rank), (2, 3, Some(0)));
    assert!(matches!(cfg.rendezvous, Rendezvous::Master { .. }));
}

/// torchrun mode against an in-test store: 3 ranks join, twice in a row (each rendezvous of a
/// process reads a fresh key: a rank must never find the first rendezvous' id in the second),
/// and MASTER_PORT stays the store's. Each rank is one thread for both rendezvous, as each is
/// one process under torchrun.
#[test]
fn from_env_through_a_tcpstore_twice() {
    let (port, _kv) = crate::bootstrap::tcpstore::tests::store();
    let world = 3;
    let sums: Vec<Vec<usize>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..world)
            .map(|rank| {
                s.spawn(move || {
                    (0..2u64)
                        .map(|round| {
                            let lookup = env(&[
                                ("MASTER_ADDR", "127.0.0.1".into()),
                                ("MASTER_PORT", port.to_string()),
                                ("RANK", rank.to_string()),
                                ("WORLD_SIZE", world.to_string()),
                                (
                                    "TORCHELASTIC_RUN_ID",
                                    format!("test-{}", std::process::id()),
                                ),
                                ("TORCHELASTIC_USE_AGENT_STORE", "True".into()),
                            ]);
                            let bs = Bootstrap::from_lookup(lookup, T).unwrap();
                            let all = bs.allgather(round, &[bs.rank() as u8]).unwrap();
                            all.iter().map(|v| v[0] as usize).sum()
                        })
                        .collect()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(sums, vec![vec![3, 3]; world]);
}
