//! Multi-process test harness: a test launches `world` copies of its own test binary, one per
//! rank, and checks that every rank exits successfully.
//!
//! ```text
//! #[test] fn allreduce_w2()  ──launch(2, "allreduce", &[])──►  <test exe> --exact worker_entry
//!                                                               (AMPCCL_TEST_ROLE=worker,
//!                                                                AMPCCL_TEST_SCENARIO=allreduce,
//!                                                                AMPCCL_UNIQUE_ID, RANK, ...)
//! #[test] fn worker_entry()  ──worker(|scenario| ...)── returns at once unless it is a worker
//! ```
//!
//! Each test binary has exactly one worker test ([`WORKER_TEST`]) that calls [`worker`] with a
//! dispatcher over scenario names. The worker reports its result on stderr and leaves with
//! [`std::process::exit`] (0: success, [`EXIT_FAILED`]: the scenario failed, [`EXIT_PANIC`]: it
//! panicked), so libtest's own reporting does not matter. This works under `cargo test`
//! (tests are threads of one process) and `cargo nextest` (each test is its own process):
//! either way the parent only needs `std::env::current_exe()` and the worker test's name.
//!
//! Set `AMPCCL_TEST_VERBOSE=1` to print every rank's stderr, also when the launch succeeds.

use std::collections::HashMap;
use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ampccl::{Communicator, Error, UniqueId};

pub mod data;
pub mod hosts;
pub mod ofi;

pub use hosts::Hosts;

/// Name of the one worker test every test binary defines.
pub const WORKER_TEST: &str = "worker_entry";
/// Environment variable that makes [`worker`] run a scenario.
pub const ROLE_VAR: &str = "AMPCCL_TEST_ROLE";
/// Environment variable holding the scenario name.
pub const SCENARIO_VAR: &str = "AMPCCL_TEST_SCENARIO";
/// Exit code of a worker whose scenario returned an error.
pub const EXIT_FAILED: i32 = 3;
/// Exit code of a worker whose scenario panicked.
pub const EXIT_PANIC: i32 = 4;
/// Line a worker prints when its scenario succeeded (a status 0 without it means the worker
/// test did not run, e.g. a wrong `--exact` name, and fails the launch).
pub const DONE_MARKER: &str = "ampccl-test-worker: scenario passed";
/// Default `AMPCCL_TIMEOUT_S` of the workers.
pub const DEFAULT_TIMEOUT_S: &str = "60";
/// Default overall deadline of a launch.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(240);

/// Result of a scenario on one rank: `Err` carries the failure description.
pub type Outcome = Result<(), String>;

// ---------------------------------------------------------------------------------------------
// Worker side
// ---------------------------------------------------------------------------------------------

/// Writes a worker's verdict to standard error in one `write`: `eprintln!` writes each formatted
/// piece on its own, and a launcher that merges the ranks' streams (Intel MPI's) then
/// interleaves two ranks' verdicts mid-line.
fn say(line: String) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// Body of the worker test: returns at once unless this process is a worker; otherwise runs
/// `dispatch(scenario)` and exits the process with its status.
pub fn worker(dispatch: impl FnOnce(&str) -> Outcome) {
    if std::env::var(ROLE_VAR).as_deref() != Ok("worker") {
        return;
    }
    let scenario = std::env::var(SCENARIO_VAR).unwrap_or_default();
    let rank = std::env::var("RANK").unwrap_or_else(|_| "?".into());
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| dispatch(&scenario)));
    let code = match r {
        Ok(Ok(())) => {
            say(format!("[rank {rank}] {scenario}: ok\n{DONE_MARKER}\n"));
            0
        }
        Ok(Err(e)) => {
            say(format!("[rank {rank}] {scenario}: FAILED: {e}\n"));
            EXIT_FAILED
        }
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "non-string panic".into());
            say(format!("[rank {rank}] {scenario}: PANICKED: {msg}\n"));
            EXIT_PANIC
        }
    };
    std::process::exit(code);
}

/// The threads of this process whose name starts with `prefix` (Linux truncates names to 15
/// bytes), read from `/proc/self/task`.
pub fn threads_named(prefix: &str) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .map(|name| name.trim_end().to_string())
        .filter(|name| name.starts_with(prefix))
        .collect()
}

/// Rank and world size of this worker (`RANK`, `WORLD_SIZE`).
pub fn rank_world() -> (usize, usize) {
    let get = |k: &str| -> usize {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("worker: {k} is not set"))
    };
    (get("RANK"), get("WORLD_SIZE"))
}

/// Joins the communicator the launcher set up (`AMPCCL_UNIQUE_ID`, `RANK`, `WORLD_SIZE`; on
/// emulated hosts, see [`Launch::on_hosts`], `MASTER_ADDR`/`MASTER_PORT` instead of the id).
pub fn init_comm() -> Result<Communicator, String> {
    let (rank, world) = rank_world();
    if std::env::var_os("AMPCCL_UNIQUE_ID").is_none() && std::env::var_os("MASTER_ADDR").is_some() {
        return Communicator::from_env().map_err(|e| format!("init rank {rank}/{world}: {e}"));
    }
    let hex = std::env::var("AMPCCL_UNIQUE_ID").map_err(|_| "AMPCCL_UNIQUE_ID is not set")?;
    let id = UniqueId::from_hex(&hex).map_err(|e| format!("bad AMPCCL_UNIQUE_ID: {e}"))?;
    Communicator::init(&id, rank, world).map_err(|e| format!("init rank {rank}/{world}: {e}"))
}

/// Formats an ampccl error for a failure message.
pub fn err(context: impl std::fmt::Display) -> impl FnOnce(Error) -> String {
    move |e| format!("{context}: {e:?}")
}

/// Fails with `msg` unless `cond`.
pub fn ensure(cond: bool, msg: impl FnOnce() -> String) -> Outcome {
    if cond { Ok(()) } else { Err(msg()) }
}

/// Runs `f::<T>(args)?` for every element type, in the order of `ampccl::DataType::ALL`
/// (stops at the first failure).
#[macro_export]
macro_rules! each_dtype {
    ($f:ident($($a:expr),*)) => {{
        $f::<i8>($($a),*)?;
        $f::<u8>($($a),*)?;
        $f::<i32>($($a),*)?;
        $f::<u32>($($a),*)?;
        $f::<i64>($($a),*)?;
        $f::<u64>($($a),*)?;
        $f::<::ampccl::f16>($($a),*)?;
        $f::<f32>($($a),*)?;
        $f::<f64>($($a),*)?;
        $f::<::ampccl::bf16>($($a),*)?;
    }};
}

// ---------------------------------------------------------------------------------------------
// Launcher side
// ---------------------------------------------------------------------------------------------

/// What a launched rank did.
#[derive(Debug)]
pub struct RankResult {
    pub rank: usize,
    pub pid: u32,
    pub status: ExitStatus,
    pub stderr: String,
    /// From spawn to exit.
    pub elapsed: Duration,
}

impl RankResult {
    /// Exit status 0 after the scenario reported success.
    pub fn success(&self) -> bool {
        self.status.success() && self.stderr.contains(DONE_MARKER)
    }

    /// The last `n` lines of stderr.
    pub fn stderr_tail(&self, n: usize) -> String {
        let lines: Vec<&str> = self.stderr.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

/// A multi-process launch (builder). [`launch`] is the common case.
pub struct Launch {
    world: usize,
    scenario: String,
    env: Vec<(String, Option<String>)>,
    ranks: Vec<usize>,
    deadline: Duration,
    may_die: Vec<usize>,
    kill: Option<(usize, Duration)>,
    unique_id: bool,
    reap_in_order: bool,
    /// The emulated hosts and the host of each rank ([`Launch::on_hosts`]).
    hosts: Option<(Hosts, Vec<usize>)>,
}

/// Launches `world` ranks running `scenario` with `extra_env` added, waits for all of them and
/// panics (failing the calling test) unless every rank exits with status 0.
pub fn launch(world: usize, scenario: &str, extra_env: &[(&str, &str)]) -> Vec<RankResult> {
    let mut l = Launch::new(world, scenario);
    for (k, v) in extra_env {
        l = l.env(k, v);
    }
    l.run()
}

impl Launch {
    pub fn new(world: usize, scenario: &str) -> Launch {
        Launch {
            world,
            scenario: scenario.into(),
            env: Vec::new(),
            ranks: (0..world).collect(),
            deadline: DEFAULT_DEADLINE,
            may_die: Vec::new(),
            kill: None,
            unique_id: true,
            reap_in_order: false,
            hosts: None,
        }
    }

    /// Sets a variable for every rank (overrides the harness's own, e.g. `AMPCCL_TIMEOUT_S`).
    pub fn env(mut self, k: &str, v: &str) -> Launch {
        self.env.push((k.into(), Some(v.into())));
        self
    }

    /// Removes a variable from every rank's environment.
    pub fn env_remove(mut self, k: &str) -> Launch {
        self.env.push((k.into(), None));
        self
    }

    /// Launches only these ranks (the others of `world` never start).
    pub fn only_ranks(mut self, ranks: &[usize]) -> Launch {
        self.ranks = ranks.to_vec();
        self
    }

    /// Overall deadline: when it passes, every rank is killed and the launch fails.
    pub fn deadline(mut self, d: Duration) -> Launch {
        self.deadline = d;
        self
    }

    /// `rank` is expected to die or fail: its exit status is not checked.
    pub fn may_die(mut self, rank: usize) -> Launch {
        self.may_die.push(rank);
        self
    }

    /// SIGKILLs `rank` this long after the launch (implies [`Launch::may_die`]).
    pub fn kill_after(mut self, rank: usize, after: Duration) -> Launch {
        self.kill = Some((rank, after));
        self.may_die(rank)
    }

    /// Does not generate a unique id (the scenario rendezvouses another way, e.g. torchrun).
    pub fn without_unique_id(mut self) -> Launch {
        self.unique_id = false;
        self
    }

    /// Reaps the ranks in launch order, like a naive launcher that `wait()`s for each child in
    /// turn: a rank that exits before the ones launched earlier stays a zombie until they exit.
    pub fn reap_in_order(mut self) -> Launch {
        self.reap_in_order = true;
        self
    }

    /// Runs rank `r` on emulated host `placement[r]` (one entry per rank of the world, e.g.
    /// `&[0, 0, 1, 1]`): its process starts through [`Hosts::command`], with `AMPCCL_TEST_HOST`
    /// set to its host index. The launcher (outside every host) cannot host the rendezvous root,
    /// so no unique id is generated: the ranks rendezvous torchrun-style, rank 0 hosting the
    /// root on its host's address (`MASTER_ADDR` = [`Hosts::addr`] of rank 0's host,
    /// `MASTER_PORT` a port, `AMPCCL_TOKEN` unique to the launch); [`init_comm`] and
    /// `Bootstrap::from_env` / `Communicator::from_env` pick that up. Everything else
    /// (environment, deadline, kills, results) is as without hosts.
    pub fn on_hosts(mut self, hosts: &Hosts, placement: &[usize]) -> Launch {
        assert_eq!(
            placement.len(),
            self.world,
            "on_hosts: one host index per rank of the world"
        );
        if let Some(&h) = placement.iter().find(|&&h| h >= hosts.len()) {
            panic!("on_hosts: host {h} of {} hosts", hosts.len());
        }
        self.hosts = Some((hosts.clone(), placement.to_vec()));
        self.unique_id = false;
        self
    }

    /// Runs the ranks and returns their results (in rank order); panics on a failure.
    pub fn run(self) -> Vec<RankResult> {
        let (results, failure) = self.run_unchecked();
        if let Some(f) = failure {
            panic!("{f}");
        }
        results
    }

    /// Runs the ranks; the second value describes the failure, if any.
    pub fn run_unchecked(self) -> (Vec<RankResult>, Option<String>) {
        // The id's root thread lives in this process until the launch ends.
        let id = self
            .unique_id
            .then(|| UniqueId::generate().expect("UniqueId::generate").to_hex());
        let exe = std::env::current_exe().expect("current_exe");
        // On emulated hosts: rank 0 hosts the root on its host's address (a fresh network
        // namespace: any port is free there).
        let master = self.hosts.as_ref().map(|(hosts, placement)| {
            static LAUNCHES: std::sync::atomic::AtomicUsize =
                std::sync::atomic::AtomicUsize::new(0);
            let n = LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            (
                hosts.addr(placement[0]).to_string(),
                free_port().to_string(),
                format!("ampccl-test-{}-{n}", std::process::id()),
            )
        });
        let start = Instant::now();
        let mut children: Vec<(usize, Child, Option<JoinHandle<String>>)> = Vec::new();
        for &rank in &self.ranks {
            let mut cmd = match &self.hosts {
                Some((hosts, placement)) => {
                    let mut c = hosts.command(placement[rank], &exe);
                    c.env("AMPCCL_TEST_HOST", placement[rank].to_string());
                    c
                }
                None => Command::new(&exe),
            };
            cmd.args(["--exact", WORKER_TEST, "--nocapture", "--test-threads=1"]);
            for k in ampccl_transport::bootstrap::RENDEZVOUS_VARS {
                cmd.env_remove(k);
            }
            cmd.env(ROLE_VAR, "worker")
                .env(SCENARIO_VAR, &self.scenario)
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", self.world.to_string())
                .env("AMPCCL_TIMEOUT_S", DEFAULT_TIMEOUT_S)
                .env("RUST_BACKTRACE", "0");
            if let Some(id) = &id {
                cmd.env("AMPCCL_UNIQUE_ID", id);
            }
            if let Some((addr, port, token)) = &master {
                cmd.env("MASTER_ADDR", addr)
                    .env("MASTER_PORT", port)
                    .env("AMPCCL_TOKEN", token);
            }
            for (k, v) in &self.env {
                match v {
                    Some(v) => cmd.env(k, v),
                    None => cmd.env_remove(k),
                };
            }
            cmd.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            let mut child = match cmd.spawn() {
                Ok(c) => c,
                Err(e) => {
                    for (_, c, _) in &mut children {
                        let _ = c.kill();
                        let _ = c.wait();
                    }
                    panic!("spawning rank {rank} of {:?}: {e}", exe);
                }
            };
            let mut pipe = child.stderr.take().expect("piped stderr");
            let reader = std::thread::spawn(move || {
                let mut buf = Vec::new();
                let _ = pipe.read_to_end(&mut buf);
                String::from_utf8_lossy(&buf).into_owned()
            });
            children.push((rank, child, Some(reader)));
        }

        let mut done: HashMap<usize, (ExitStatus, Duration)> = HashMap::new();
        let mut killed = false;
        let mut timed_out = false;
        while done.len() < children.len() {
            let now = start.elapsed();
            if let Some((victim, after)) = self.kill
                && !killed
                && now >= after
            {
                killed = true;
                for (rank, c, _) in &mut children {
                    if *rank == victim && !done.contains_key(rank) {
                        let _ = c.kill();
                    }
                }
            }
            if now >= self.deadline {
                timed_out = true;
                for (rank, c, _) in &mut children {
                    if !done.contains_key(rank) {
                        let _ = c.kill();
                    }
                }
            }
            for (rank, c, _) in &mut children {
                if done.contains_key(rank) {
                    continue;
                }
                let st = if timed_out {
                    c.wait().ok()
                } else {
                    c.try_wait().ok().flatten()
                };
                if let Some(st) = st {
                    done.insert(*rank, (st, start.elapsed()));
                } else if self.reap_in_order {
                    break;
                }
            }
            if done.len() < children.len() {
                std::thread::sleep(Duration::from_millis(5));
            }
        }

        let results: Vec<RankResult> = children
            .into_iter()
            .map(|(rank, c, reader)| {
                let (status, elapsed) = done[&rank];
                let stderr = reader
                    .and_then(|h| h.join().ok())
                    .unwrap_or_else(|| "<stderr lost>".into());
                RankResult {
                    rank,
                    pid: c.id(),
                    status,
                    stderr,
                    elapsed,
                }
            })
            .collect();

        let failed: Vec<&RankResult> = results
            .iter()
            .filter(|r| !r.success() && !self.may_die.contains(&r.rank))
            .collect();
        if std::env::var_os("AMPCCL_TEST_VERBOSE").is_some() {
            for r in &results {
                eprintln!(
                    "--- rank {} (pid {}, {}, {:.2?}):\n{}",
                    r.rank,
                    r.pid,
                    describe_result(r),
                    r.elapsed,
                    r.stderr
                );
            }
        }
        let failure = if timed_out || !failed.is_empty() {
            let mut msg = format!(
                "scenario {:?} on {} ranks: {}",
                self.scenario,
                self.world,
                if timed_out {
                    format!("deadline of {:?} passed, every rank killed", self.deadline)
                } else {
                    let names: Vec<String> = failed
                        .iter()
                        .map(|r| format!("rank {} ({})", r.rank, describe_result(r)))
                        .collect();
                    format!("failed: {}", names.join(", "))
                }
            );
            // The failed ranks first: a rank that fails usually makes its peers fail after it.
            let mut order: Vec<&RankResult> = failed.clone();
            order.extend(
                results
                    .iter()
                    .filter(|r| !failed.iter().any(|f| f.rank == r.rank)),
            );
            for r in order {
                msg += &format!(
                    "\n--- rank {} (pid {}, {}, {:.2?}) stderr tail:\n{}",
                    r.rank,
                    r.pid,
                    describe_result(r),
                    r.elapsed,
                    r.stderr_tail(30)
                );
            }
            Some(msg)
        } else {
            None
        };
        (results, failure)
    }
}

/// `exit 3`, `signal 9`, ...
pub fn describe(st: &ExitStatus) -> String {
    describe_status(st)
}

fn describe_result(r: &RankResult) -> String {
    if r.status.success() && !r.success() {
        "exit 0 without running the scenario".into()
    } else {
        describe_status(&r.status)
    }
}

fn describe_status(st: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exit {c}"),
        (None, Some(s)) => format!("signal {s}"),
        _ => format!("{st}"),
    }
}

/// Shared-memory segments in `/dev/shm` named after `pid` (`ampccl.<pid>.*`).
pub fn shm_segments_of(pid: u32) -> Vec<String> {
    let prefix = format!("ampccl.{pid}.");
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}
