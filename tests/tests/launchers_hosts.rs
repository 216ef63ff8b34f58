//! Launchers across 2 emulated hosts (`ampccl_tests::hosts`, docs/TESTING.md), the ranks (this
//! binary's `worker_entry`) joining with `Communicator::from_env`, rank 1 reaching rank 0's
//! root on host 0 over the bridge:
//! - torchrun: one agent per host, `--nnodes=2` with static rendezvous at host 0's address;
//!   host 0's agent holds `MASTER_PORT` with its TCPStore, the ranks join through it;
//! - Intel MPI's `mpirun` in host 0: hydra starts its proxy in host 1 through the ssh
//!   stand-in `benches/scripts/hosts_ssh.sh`, the ranks join through PMI-1 on `PMI_FD`.
//!
//! Needs root and the tools of the harness, and torch and Intel MPI from
//! `benches/peers/install.sh --launchers`; without them a test prints why and passes, except
//! under `CI`.

use std::io::Read;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use ampccl::ReduceOp;
use ampccl_tests::hosts::in_ci;
use ampccl_tests::{Hosts, Outcome, ROLE_VAR, SCENARIO_VAR, WORKER_TEST, ensure, err, worker};

const SCENARIO: &str = "torchrun_across_hosts";
const MPI_SCENARIO: &str = "mpirun_across_hosts";

#[test]
fn worker_entry() {
    worker(|scenario| match scenario {
        SCENARIO => {
            ensure(
                std::env::var("TORCHELASTIC_USE_AGENT_STORE").as_deref() == Ok("True"),
                || "torchrun did not hand its agent's store to the ranks".into(),
            )?;
            rank_on_two_hosts()
        }
        MPI_SCENARIO => {
            ensure(std::env::var_os("PMI_FD").is_some(), || {
                "mpirun did not hand PMI_FD to the ranks".into()
            })?;
            rank_on_two_hosts()
        }
        s => Err(format!("unknown scenario {s:?}")),
    });
}

/// A rank under a launcher: joins through it, checks a sum and that the ranks are on 2 hosts.
fn rank_on_two_hosts() -> Outcome {
    let comm = ampccl::Communicator::from_env().map_err(err("from_env"))?;
    let mut x = [comm.rank() as u64 + 1];
    comm.all_reduce_in_place(&mut x, ReduceOp::Sum)
        .map_err(err("allreduce"))?;
    ensure(x[0] == 3, || format!("sum {}, expected 3", x[0]))?;
    ensure(comm.topology().hosts() == 2, || {
        format!("{} hosts, expected 2", comm.topology().hosts())
    })?;
    ensure(comm.local_rank() == 0, || {
        format!("local rank {}", comm.local_rank())
    })?;
    comm.destroy().map_err(err("destroy"))
}

/// `rel` under the peers' home (`benches/peers/install.sh`), if installed.
fn peer_file(rel: &str) -> Option<PathBuf> {
    let home = std::env::var_os("PEERS_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ampccl-peers")
        });
    let p = home.join(rel);
    if p.exists() {
        return Some(p);
    }
    assert!(
        !in_ci(),
        "{} is missing: run benches/peers/install.sh --launchers",
        p.display()
    );
    println!("SKIPPED: {} is missing", p.display());
    None
}

#[test]
fn torchrun_across_two_hosts() {
    let Some(torchrun) = peer_file("torch/bin/torchrun") else {
        return;
    };
    let Some(hosts) = Hosts::new_or_skip(2) else {
        return;
    };
    let exe = std::env::current_exe().unwrap();
    let mut agents = Vec::new();
    for node in 0..2 {
        let mut cmd = hosts.command(node, &torchrun);
        cmd.args([
            "--nnodes=2",
            "--nproc_per_node=1",
            &format!("--node_rank={node}"),
            &format!("--master_addr={}", hosts.addr(0)),
            "--master_port=29500",
            "--no-python",
        ])
        .arg(&exe)
        .args(["--exact", WORKER_TEST, "--nocapture", "--test-threads=1"]);
        for k in ampccl_transport::bootstrap::RENDEZVOUS_VARS {
            cmd.env_remove(k);
        }
        cmd.env(ROLE_VAR, "worker")
            .env(SCENARIO_VAR, SCENARIO)
            .env("AMPCCL_LOG", "info")
            .env("AMPCCL_TIMEOUT_S", "60")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        agents.push(spawn_logged(cmd));
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut report = String::new();
    let mut ok = true;
    for (node, agent) in agents.into_iter().enumerate() {
        let (status, log) = wait_logged(agent, deadline);
        let rank_ok = log.contains(&format!("[rank {node}] {SCENARIO}: ok"));
        let via_store = log.contains("rendezvous through torchrun's TCPStore");
        ok &= status.is_some_and(|s| s.success()) && rank_ok && via_store;
        report +=
            &format!("--- host {node}: {status:?}, ok line {rank_ok}, store {via_store}\n{log}\n");
    }
    assert!(ok, "{report}");
}

/// A started process and the thread collecting its stderr.
type Logged = (std::process::Child, std::thread::JoinHandle<String>);

/// Starts `cmd` with its stderr piped into a collecting thread.
fn spawn_logged(mut cmd: std::process::Command) -> Logged {
    let mut child = cmd.stderr(Stdio::piped()).spawn().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    (child, reader)
}

/// Waits for a [`spawn_logged`] process to end, killing it at `deadline`; its status (`None`:
/// killed) and stderr.
fn wait_logged(
    (mut child, reader): Logged,
    deadline: Instant,
) -> (Option<std::process::ExitStatus>, String) {
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (status, reader.join().unwrap())
}

#[test]
fn intel_mpi_across_two_hosts() {
    let Some(mpirun) = peer_file("impi/bin/mpirun") else {
        return;
    };
    let Some(hosts) = Hosts::new_or_skip(2) else {
        return;
    };
    let root = mpirun
        .parent()
        .and_then(|b| b.parent())
        .unwrap()
        .to_path_buf();
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let exe = std::env::current_exe().unwrap();
    let mut cmd = hosts.command(0, &mpirun);
    for h in 0..2 {
        if h > 0 {
            cmd.arg(":");
        }
        cmd.args(["-n", "1", "-host", &hosts.addr(h).to_string()])
            .arg(&exe)
            .args(["--exact", WORKER_TEST, "--nocapture", "--test-threads=1"]);
    }
    for k in [
        "AMPCCL_UNIQUE_ID",
        "AMPCCL_RENDEZVOUS",
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "WORLD_SIZE",
    ] {
        cmd.env_remove(k);
    }
    let holders: Vec<String> = (0..2).map(|h| hosts.holder_pid(h).to_string()).collect();
    let path = format!(
        "{}:{}",
        root.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    cmd.env(ROLE_VAR, "worker")
        .env(SCENARIO_VAR, MPI_SCENARIO)
        .env("AMPCCL_LOG", "info")
        .env("AMPCCL_TIMEOUT_S", "60")
        .env("I_MPI_ROOT", &root)
        .env("PATH", path)
        .env("LD_LIBRARY_PATH", root.join("lib"))
        .env("I_MPI_HYDRA_BOOTSTRAP", "ssh")
        .env(
            "I_MPI_HYDRA_BOOTSTRAP_EXEC",
            repo.join("benches/scripts/hosts_ssh.sh"),
        )
        .env("AMPCCL_HOSTS_HOLDERS", holders.join(" "))
        .env("I_MPI_HYDRA_IFACE", "eth0")
        .env("FI_TCP_IFACE", "eth0")
        .env("FI_PROVIDER", "tcp")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    let (status, log) = wait_logged(spawn_logged(cmd), Instant::now() + Duration::from_secs(120));
    // Ranks under PMI have no RANK variable for the worker's prefix: count the ok lines.
    let ranks_ok = log.matches(&format!("{MPI_SCENARIO}: ok")).count() == 2;
    let via_pmi = log.contains("rendezvous through the launcher's PMI-1");
    assert!(
        status.is_some_and(|s| s.success()) && ranks_ok && via_pmi,
        "{status:?}, ranks ok {ranks_ok}, PMI {via_pmi}\n{log}"
    );
}
