//! Emulated hosts: `K` "hosts" on this machine, each with its own network, UTS and mount
//! namespace, joined by a bridge, so that multi-host code paths run in the test suite.
//!
//! ```text
//!   bridge namespace  <tag>-br            host namespaces <tag>-h<i>
//!   ┌───────────────────────────┐         ┌──────────────────────────────────────┐
//!   │ br0 ── p0 ════════════════╪═ veth ══╪ eth0 10.213.0.1/24, lo  (host 0)     │
//!   │     ── p1 ════════════════╪═ veth ══╪ eth0 10.213.0.2/24, lo  (host 1) ... │
//!   └───────────────────────────┘         └──────────────────────────────────────┘
//! ```
//!
//! * **Network**: a named network namespace per host (`ip netns`, `<tag>-h<i>`) whose `eth0`
//!   (a veth) has `10.213.0.<i+1>/24` and is plugged into port `p<i>` of bridge `br0`, which lives
//!   in a namespace of its own (`<tag>-br`). Loopback is up in every host. The subnet exists only
//!   inside these namespaces: nothing is added to the machine's own network namespace, and no
//!   packet can leave the machine.
//! * **Hostname and `/dev/shm`**: per host, one *holder* process (a `sh` blocked in `read`) lives
//!   in the host's network namespace and in a UTS namespace (hostname [`Hosts::hostname`]) and a
//!   mount namespace of its own, with a private tmpfs mounted on `/dev/shm`. [`Hosts::command`]
//!   runs programs through `nsenter` into the holder's three namespaces, so every process of one
//!   host shares its hostname and `/dev/shm`, and shared memory between hosts is impossible:
//!   what passes between hosts went through the network. (The kernel boot id is the same in
//!   every namespace; the hostname tells hosts apart, also for the bootstrap's host id.)
//! * **Faults and shaping**: [`Hosts::set_rate`] puts a `tc tbf` qdisc on both ends of a host's
//!   veth (`tc netem` is not available on every kernel, `tbf` is); [`Hosts::link_down`] takes the
//!   host's bridge port down, like a pulled cable (the host's `eth0` loses carrier);
//!   [`Hosts::set_quickack`] makes a host's TCP acknowledge every segment at once.
//!
//! **Cleanup.** Names are `ampccl-hosts-<pid>-<n>-…` (`<n>` counts the [`Hosts`] of this
//! process), so parallel test processes never collide. Dropping the last handle (also while
//! unwinding from a panic) kills the holders and deletes the namespaces, which removes the veths
//! and the bridge with them. A holder's stdin is a pipe from the test process, so a killed test
//! process leaves no holder behind (it reads EOF and exits); the named network namespaces of a
//! process that died without dropping are swept by the next [`Hosts::new`] (any name with the
//! prefix whose pid is not running).
//!
//! **Requirements**: root, `ip` and `tc` (iproute2), `unshare` and `nsenter` (util-linux),
//! `mount`, `sh`. Without them [`Hosts::new`] returns an error; [`Hosts::new_or_skip`] turns it
//! into a skip, except under CI (`CI` set), where it fails the test.

use std::io::{BufRead, BufReader, Read};
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Prefix of every network namespace name the harness creates.
pub const NETNS_PREFIX: &str = "ampccl-hosts-";
/// Most hosts of one [`Hosts`] (addresses `10.213.0.1` to `10.213.0.250`).
pub const MAX_HOSTS: usize = 250;
/// The hosts' subnet (host `i` is `10.213.0.<i+1>`).
const SUBNET: &str = "10.213.0.0/24";
/// Where `ip netns` keeps its names.
const NETNS_DIR: &str = "/run/netns";

static INSTANCES: AtomicUsize = AtomicUsize::new(0);

/// `K` emulated hosts (see the [module documentation](self)). Cheap to clone: the clones share
/// the hosts, which are torn down when the last one is dropped.
#[derive(Clone)]
pub struct Hosts {
    inner: Arc<Inner>,
}

struct Host {
    netns: String,
    hostname: String,
    addr: Ipv4Addr,
    /// The process that holds the host's UTS and mount namespaces.
    holder: Child,
}

struct Inner {
    tag: String,
    bridge_ns: String,
    hosts: Vec<Host>,
    /// Every network namespace created so far, the bridge's first (deleted on drop).
    created: Vec<String>,
}

impl std::fmt::Debug for Hosts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hosts: Vec<String> = self
            .inner
            .hosts
            .iter()
            .map(|h| format!("{} {} ({})", h.netns, h.addr, h.hostname))
            .collect();
        f.debug_struct("Hosts")
            .field("bridge", &self.inner.bridge_ns)
            .field("hosts", &hosts)
            .finish()
    }
}

/// True when running under CI (`CI` set to anything but empty, `0` or `false`).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false"))
}

impl Hosts {
    /// Creates `k` hosts (1 to [`MAX_HOSTS`]). Fails, creating nothing, when this process is not
    /// root or a tool is missing; a failure half-way removes what was created.
    pub fn new(k: usize) -> Result<Hosts, String> {
        if k == 0 || k > MAX_HOSTS {
            return Err(format!("Hosts::new({k}): between 1 and {MAX_HOSTS} hosts"));
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("emulated hosts need root (network namespaces, veths, mounts)".into());
        }
        for (tool, arg) in [
            ("ip", "-V"),
            ("tc", "-V"),
            ("unshare", "--version"),
            ("nsenter", "--version"),
        ] {
            run_quiet(Command::new(tool).arg(arg))
                .map_err(|e| format!("emulated hosts need `{tool}`: {e}"))?;
        }
        let _lock = SetupLock::take();
        sweep_stale();

        let n = INSTANCES.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{NETNS_PREFIX}{}-{n}", std::process::id());
        let mut inner = Inner {
            bridge_ns: format!("{tag}-br"),
            tag,
            hosts: Vec::new(),
            created: Vec::new(),
        };
        // On an error, dropping `inner` removes what was created so far.
        inner.build(k)?;
        Ok(Hosts {
            inner: Arc::new(inner),
        })
    }

    /// [`Hosts::new`], or `None` after printing why the test is skipped. Under CI (see
    /// [`in_ci`]) emulated hosts must work: the error panics, failing the test.
    pub fn new_or_skip(k: usize) -> Option<Hosts> {
        match Hosts::new(k) {
            Ok(h) => Some(h),
            Err(e) if in_ci() => panic!("emulated hosts are required under CI (CI is set): {e}"),
            Err(e) => {
                eprintln!("SKIPPED: no emulated hosts: {e}");
                None
            }
        }
    }

    /// Number of hosts.
    pub fn len(&self) -> usize {
        self.inner.hosts.len()
    }

    /// Always false (a [`Hosts`] has at least one host).
    pub fn is_empty(&self) -> bool {
        self.inner.hosts.is_empty()
    }

    /// Address of host `i` (`10.213.0.<i+1>`), reachable from every host.
    pub fn addr(&self, i: usize) -> Ipv4Addr {
        self.host(i).addr
    }

    /// Hostname of host `i` (`ampccl-host<i>-<pid>-<n>`): what `hostname` and
    /// `/proc/sys/kernel/hostname` say inside it.
    pub fn hostname(&self, i: usize) -> &str {
        &self.host(i).hostname
    }

    /// Name of host `i`'s network namespace (`ip netns`).
    pub fn netns(&self, i: usize) -> &str {
        &self.host(i).netns
    }

    /// Name of the bridge's network namespace.
    pub fn bridge_netns(&self) -> &str {
        &self.inner.bridge_ns
    }

    /// Every network namespace of these hosts, the bridge's first.
    pub fn netns_names(&self) -> Vec<String> {
        self.inner.created.clone()
    }

    /// Pid of the process holding host `i`'s namespaces (tests of the cleanup).
    pub fn holder_pid(&self, i: usize) -> u32 {
        self.host(i).holder.id()
    }

    /// A command that runs `program` inside host `i` (its network, UTS and mount namespaces,
    /// through `nsenter`), in this process's current directory. Add arguments, environment and
    /// stdio as for any [`Command`]: `nsenter` passes them on and execs `program` in its own
    /// process, so the child's pid and signals are the program's. (Set the working directory
    /// with [`Hosts::command_in`], not [`Command::current_dir`]: entering the mount namespace
    /// resets it.)
    pub fn command(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let cwd = std::env::current_dir().unwrap_or_else(|_| "/".into());
        self.command_in(i, &cwd, program)
    }

    /// [`Hosts::command`] with working directory `dir`.
    pub fn command_in(
        &self,
        i: usize,
        dir: &Path,
        program: impl AsRef<std::ffi::OsStr>,
    ) -> Command {
        let mut wd = std::ffi::OsString::from("--wd=");
        wd.push(dir);
        let mut c = Command::new("nsenter");
        c.arg("-t")
            .arg(self.holder_pid(i).to_string())
            .args(["--net", "--uts", "--mount"])
            .arg(wd)
            .arg("--")
            .arg(program);
        c
    }

    /// Limits host `i`'s link to `rate` (a `tc` rate: `100mbit`, `5gbit`, `800kbit`, `1gbps`,
    /// ...) in both directions, with a `tbf` qdisc on both ends of its veth (burst: 4 ms of
    /// `rate`, at least 128 KiB; queue: 50 ms). Replaces an earlier rate.
    pub fn set_rate(&self, i: usize, rate: &str) -> Result<(), String> {
        let bytes_per_s = parse_rate(rate)?;
        let burst = ((bytes_per_s as f64 * 0.004) as u64).max(128 * 1024);
        let burst = burst.to_string();
        for (ns, dev) in self.link_ends(i) {
            run_quiet(Command::new("tc").args([
                "-n", &ns, "qdisc", "replace", "dev", &dev, "root", "tbf", "rate", rate, "burst",
                &burst, "latency", "50ms",
            ]))?;
        }
        Ok(())
    }

    /// Sets the TCP congestion control of host `i`'s connections
    /// (`net.ipv4.tcp_congestion_control` in its namespace, e.g. `cubic`): a new namespace takes
    /// the machine's, which need not be what the hosts being emulated run.
    pub fn set_congestion_control(&self, i: usize, name: &str) -> Result<(), String> {
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(format!(
                "congestion control {name:?}: expected a name such as cubic"
            ));
        }
        run_quiet(Command::new("ip").args([
            "netns",
            "exec",
            self.netns(i),
            "sysctl",
            "-qw",
            &format!("net.ipv4.tcp_congestion_control={name}"),
        ]))
        .map_err(|e| {
            // Outside the machine's own namespace the kernel lets only the allowed ones be
            // chosen (the machine's default and reno, unless root widened the list).
            let allowed = allowed_congestion_controls();
            if allowed.iter().any(|a| a == name) {
                return e;
            }
            let allowed = allowed.join(" ");
            format!(
                "congestion control {name} is not allowed in network namespaces here \
                 (net.ipv4.tcp_allowed_congestion_control = {allowed}; as root: sysctl -w \
                 net.ipv4.tcp_allowed_congestion_control=\"{allowed} {name}\"): {e}"
            )
        })
    }

    /// Makes host `i` acknowledge every TCP segment it receives at once: its route to the
    /// hosts' subnet gets the `quickack` metric (`ip route change ... quickack 1`). Otherwise
    /// Linux delays an acknowledgement until the reader's `recv` when the receive window would
    /// not grow, a state a connection enters or leaves with the sizes it carried before; over a
    /// veth that `recv` then also runs the peer's receipt of the acknowledgement, several
    /// microseconds. With the metric both programs of a latency comparison pay the same
    /// whatever their connections carried (docs/PERFORMANCE.md, "Where `ofi` trails").
    pub fn set_quickack(&self, i: usize) -> Result<(), String> {
        let host = self.host(i);
        run_quiet(Command::new("ip").args([
            "-n",
            &host.netns,
            "route",
            "change",
            SUBNET,
            "dev",
            "eth0",
            "proto",
            "kernel",
            "scope",
            "link",
            "src",
            &host.addr.to_string(),
            "quickack",
            "1",
        ]))
    }

    /// Removes the rate limit of [`Hosts::set_rate`] (nothing if none).
    pub fn clear_rate(&self, i: usize) -> Result<(), String> {
        for (ns, dev) in self.link_ends(i) {
            let shown = output(Command::new("tc").args(["-n", &ns, "qdisc", "show", "dev", &dev]))?;
            if shown.contains("tbf") {
                run_quiet(
                    Command::new("tc").args(["-n", &ns, "qdisc", "del", "dev", &dev, "root"]),
                )?;
            }
        }
        Ok(())
    }

    /// Takes host `i`'s link down: its port on the bridge goes down (`ip link set p<i> down` in
    /// the bridge namespace), so host `i`'s `eth0` loses carrier and no packet passes either
    /// way; the host's own address and routes stay, as when a cable is pulled. Connections
    /// neither close nor reset: peers notice by their timeouts.
    pub fn link_down(&self, i: usize) -> Result<(), String> {
        self.set_link(i, "down")
    }

    /// Brings host `i`'s link back up after [`Hosts::link_down`].
    pub fn link_up(&self, i: usize) -> Result<(), String> {
        self.set_link(i, "up")
    }

    /// `ip link set p<i> <state>` in the bridge namespace.
    fn set_link(&self, i: usize, state: &str) -> Result<(), String> {
        self.host(i);
        run_quiet(Command::new("ip").args([
            "-n",
            &self.inner.bridge_ns,
            "link",
            "set",
            &format!("p{i}"),
            state,
        ]))
    }

    fn host(&self, i: usize) -> &Host {
        self.inner
            .hosts
            .get(i)
            .unwrap_or_else(|| panic!("no host {i} (of {})", self.inner.hosts.len()))
    }

    /// (namespace, device) of both ends of host `i`'s veth.
    fn link_ends(&self, i: usize) -> [(String, String); 2] {
        [
            (self.host(i).netns.clone(), "eth0".into()),
            (self.inner.bridge_ns.clone(), format!("p{i}")),
        ]
    }
}

impl Inner {
    fn build(&mut self, k: usize) -> Result<(), String> {
        let br = self.bridge_ns.clone();
        self.add_netns(&br)?;
        ip(&br, &["link", "add", "br0", "type", "bridge"])?;
        ip(&br, &["link", "set", "br0", "up"])?;
        ip(&br, &["link", "set", "lo", "up"])?;
        for i in 0..k {
            let ns = format!("{}-h{i}", self.tag);
            let port = format!("p{i}");
            let addr = Ipv4Addr::new(10, 213, 0, i as u8 + 1);
            self.add_netns(&ns)?;
            ip(
                &br,
                &[
                    "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns,
                ],
            )?;
            ip(&br, &["link", "set", &port, "master", "br0", "up"])?;
            ip(&ns, &["addr", "add", &format!("{addr}/24"), "dev", "eth0"])?;
            ip(&ns, &["link", "set", "eth0", "up"])?;
            ip(&ns, &["link", "set", "lo", "up"])?;
            let hostname = format!(
                "ampccl-host{i}-{}",
                self.tag.trim_start_matches(NETNS_PREFIX)
            );
            let holder = spawn_holder(&ns, &hostname)?;
            self.hosts.push(Host {
                netns: ns,
                hostname,
                addr,
                holder,
            });
        }
        Ok(())
    }

    fn add_netns(&mut self, name: &str) -> Result<(), String> {
        run_quiet(Command::new("ip").args(["netns", "add", name]))?;
        self.created.push(name.to_owned());
        Ok(())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        for h in &mut self.hosts {
            let _ = h.holder.kill();
            let _ = h.holder.wait();
        }
        for ns in &self.created {
            if let Err(e) = run_quiet(Command::new("ip").args(["netns", "del", ns])) {
                eprintln!("emulated hosts: cleanup: {e}");
            }
        }
    }
}

/// Starts the process holding a host's UTS and mount namespaces (in its network namespace):
/// it sets the hostname, mounts a private tmpfs on `/dev/shm`, says `ready` and waits for EOF
/// on stdin (a pipe from this process: it exits when we do, even when killed).
fn spawn_holder(netns: &str, hostname: &str) -> Result<Child, String> {
    let script = "printf '%s\\n' \"$1\" > /proc/sys/kernel/hostname && \
                  mount -t tmpfs -o mode=1777 ampccl-shm /dev/shm && \
                  echo ready && read _unused";
    let mut child = Command::new("ip")
        .args(["netns", "exec", netns])
        .args(["unshare", "--uts", "--mount", "--propagation", "private"])
        .args(["sh", "-c", script, "ampccl-host-holder", hostname])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawning the holder of {netns}: {e}"))?;
    let mut line = String::new();
    let stdout = child.stdout.take().expect("piped stdout");
    let _ = BufReader::new(stdout).read_line(&mut line);
    if line.trim() != "ready" {
        let _ = child.kill();
        let _ = child.wait();
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        return Err(format!(
            "the holder of host {netns} (hostname, /dev/shm) failed: {}",
            err.trim()
        ));
    }
    // Its stderr is not read again: nothing more is written there.
    Ok(child)
}

/// `ip -n <ns> <args>`.
fn ip(ns: &str, args: &[&str]) -> Result<(), String> {
    run_quiet(Command::new("ip").args(["-n", ns]).args(args))
}

/// Runs `cmd` to completion; an error names the command and carries its stderr.
fn run_quiet(cmd: &mut Command) -> Result<(), String> {
    output(cmd).map(drop)
}

/// Runs `cmd` to completion and returns its stdout.
fn output(cmd: &mut Command) -> Result<String, String> {
    let shown = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{shown}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{shown}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Bytes per second of a `tc` rate (`<number><unit>`, unit `bit`, `kbit`, `mbit`, `gbit`,
/// `tbit`, `bps`, `kbps`, `mbps`, `gbps`, `tbps`; `bps` is bytes per second, as in `tc`).
pub fn parse_rate(rate: &str) -> Result<u64, String> {
    let r = rate.trim().to_ascii_lowercase();
    let split = r
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(r.len());
    let (num, unit) = r.split_at(split);
    let num: f64 = num
        .parse()
        .map_err(|_| format!("rate {rate:?}: expected a number and a unit, e.g. 100mbit"))?;
    let (scale, bits) = match unit {
        "bit" => (1.0, true),
        "kbit" => (1e3, true),
        "mbit" => (1e6, true),
        "gbit" => (1e9, true),
        "tbit" => (1e12, true),
        "bps" => (1.0, false),
        "kbps" => (1e3, false),
        "mbps" => (1e6, false),
        "gbps" => (1e9, false),
        "tbps" => (1e12, false),
        _ => {
            return Err(format!(
                "rate {rate:?}: unknown unit {unit:?} (bit, kbit, mbit, gbit, ...)"
            ));
        }
    };
    let bytes = num * scale / if bits { 8.0 } else { 1.0 };
    if !(bytes >= 1.0 && bytes.is_finite()) {
        return Err(format!("rate {rate:?} is out of range"));
    }
    Ok(bytes as u64)
}

/// Network namespaces named by the harness (`ip netns`), e.g. to check that none is left.
pub fn harness_netns() -> Vec<String> {
    std::fs::read_dir(NETNS_DIR)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(NETNS_PREFIX))
                .collect()
        })
        .unwrap_or_default()
}

/// Deletes the harness's network namespaces whose creating process is gone (a test process
/// killed before its [`Hosts`] was dropped).
fn sweep_stale() {
    for name in harness_netns() {
        let pid: Option<u32> = name[NETNS_PREFIX.len()..]
            .split('-')
            .next()
            .and_then(|p| p.parse().ok());
        let Some(pid) = pid else { continue };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        match run_quiet(Command::new("ip").args(["netns", "del", &name])) {
            Ok(()) => eprintln!("emulated hosts: removed stale network namespace {name}"),
            // Another process's sweep may have been first.
            Err(e) if !Path::new(NETNS_DIR).join(&name).exists() => drop(e),
            Err(e) => eprintln!("emulated hosts: stale {name}: {e}"),
        }
    }
}

/// An exclusive `flock` on a file in `/run` while namespaces are swept and created, so that
/// concurrent test processes do not race in `ip netns`'s first-use setup of `/run/netns`.
struct SetupLock(Option<std::fs::File>);

impl SetupLock {
    fn take() -> SetupLock {
        use std::os::fd::AsRawFd;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open("/run/ampccl-hosts.lock")
            .ok();
        if let Some(f) = &file {
            // SAFETY: a valid open descriptor; flock has no other preconditions.
            unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        }
        SetupLock(file)
    }
}

impl Drop for SetupLock {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        if let Some(f) = &self.0 {
            // SAFETY: as in `take`.
            unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_UN) };
        }
    }
}

/// The congestion controls a network namespace other than the machine's may choose
/// (`net.ipv4.tcp_allowed_congestion_control`; always includes reno).
pub fn allowed_congestion_controls() -> Vec<String> {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::parse_rate;

    #[test]
    fn rates() {
        assert_eq!(parse_rate("100mbit"), Ok(12_500_000));
        assert_eq!(parse_rate("5Gbit"), Ok(625_000_000));
        assert_eq!(parse_rate("1.5kbps"), Ok(1500));
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("10").is_err());
        assert!(parse_rate("0bit").is_err());
    }
}
