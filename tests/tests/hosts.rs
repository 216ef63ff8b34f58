//! The emulated-hosts harness (`ampccl_tests::hosts`): hosts reach each other over the bridge
//! and nothing else is shared (hostname, `/dev/shm`), rate shaping and link faults act, nothing
//! is left behind, and ranks placed on hosts by `Launch::on_hosts` rendezvous across them.
//!
//! Without root or the tools, each test prints why and passes; under CI (`CI` set) it fails.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ampccl_tests::hosts::harness_netns;
use ampccl_tests::{Hosts, Launch, Outcome, WORKER_TEST, ensure, rank_world, worker};
use ampccl_transport::bootstrap::Bootstrap;

/// Makes the test binary a small network helper run inside a host (see [`helper`]).
const HELPER_VAR: &str = "AMPCCL_HOSTS_HELPER";
/// Marks the helper's report lines on stdout (libtest prints there too, also on the same line).
const SAYS: &str = "hosts-helper: ";
/// A helper process exits after this long, whatever it waits for: no test can hang on one.
const HELPER_LIMIT: Duration = Duration::from_secs(20);

/// What follows [`SAYS`] in `line`, if it is a report line.
fn said(line: &str) -> Option<&str> {
    line.find(SAYS).map(|i| line[i + SAYS.len()..].trim_end())
}

#[test]
fn worker_entry() {
    if let Ok(job) = std::env::var(HELPER_VAR) {
        std::process::exit(helper(&job));
    }
    worker(|scenario| match scenario {
        "hostnames" => hostnames(),
        "peer_killed" => peer_killed(),
        s => Err(format!("unknown scenario {s:?}")),
    });
}

// ---------------------------------------------------------------------------------------------
// Helper programs (this binary, run inside a host)
// ---------------------------------------------------------------------------------------------

/// `serve ADDR:PORT`: accepts one connection, reads to EOF, answers the byte count (8 bytes LE).
/// `send ADDR:PORT BYTES`: connects (2 s timeout), sends `BYTES`, half-closes and waits for the
/// answer; reports the seconds from connect to answer. Exit 0 on success, 2 on a failure, each
/// with a line `hosts-helper: ...` on stdout.
fn helper(job: &str) -> i32 {
    std::thread::spawn(|| {
        std::thread::sleep(HELPER_LIMIT);
        println!("\n{SAYS}error: still running after {HELPER_LIMIT:?}");
        std::process::exit(2);
    });
    let args: Vec<&str> = job.split_whitespace().collect();
    let r = match args.as_slice() {
        ["serve", addr] => serve(addr),
        ["send", addr, bytes] => send(addr, bytes.parse().unwrap_or(0)),
        _ => Err(format!("bad helper job {job:?}")),
    };
    match r {
        Ok(msg) => {
            println!("\n{SAYS}{msg}");
            0
        }
        Err(e) => {
            println!("\n{SAYS}error: {e}");
            2
        }
    }
}

fn serve(addr: &str) -> Result<String, String> {
    let l = TcpListener::bind(addr).map_err(|e| format!("bind {addr}: {e}"))?;
    println!("\n{SAYS}listening");
    std::io::stdout().flush().ok();
    let (mut s, peer) = l.accept().map_err(|e| format!("accept: {e}"))?;
    let mut n = 0u64;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => n += k as u64,
            Err(e) => return Err(format!("read: {e}")),
        }
    }
    s.write_all(&n.to_le_bytes())
        .map_err(|e| format!("answer: {e}"))?;
    Ok(format!("received {n} bytes from {}", peer.ip()))
}

fn send(addr: &str, bytes: u64) -> Result<String, String> {
    let to: SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
    let t = Instant::now();
    let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(2))
        .map_err(|e| format!("connect {to}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(15))).ok();
    let chunk = vec![7u8; 1 << 16];
    let mut left = bytes;
    while left > 0 {
        let k = left.min(chunk.len() as u64) as usize;
        s.write_all(&chunk[..k])
            .map_err(|e| format!("write: {e}"))?;
        left -= k as u64;
    }
    s.shutdown(std::net::Shutdown::Write).ok();
    let mut answer = [0u8; 8];
    s.read_exact(&mut answer)
        .map_err(|e| format!("answer: {e}"))?;
    let got = u64::from_le_bytes(answer);
    if got != bytes {
        return Err(format!("the server received {got} of {bytes} bytes"));
    }
    Ok(format!("sent {bytes} in {:.6}", t.elapsed().as_secs_f64()))
}

/// This test binary as a helper running `job` in host `i`.
fn helper_cmd(hosts: &Hosts, i: usize, job: &str) -> Command {
    let mut c = hosts.command(i, std::env::current_exe().expect("current_exe"));
    c.args(["--exact", WORKER_TEST, "--nocapture", "--test-threads=1"])
        .env(HELPER_VAR, job)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    c
}

/// Starts a server in host `i` on `port` and waits until it listens.
fn start_server(
    hosts: &Hosts,
    i: usize,
    port: u16,
) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut c = helper_cmd(hosts, i, &format!("serve {}:{port}", hosts.addr(i)))
        .spawn()
        .expect("spawn the server");
    // The server is reaped before a failure is reported.
    let fail = |c: &mut Child, why: String| -> ! {
        let _ = c.kill();
        let _ = c.wait();
        panic!("server in host {i}: {why}");
    };
    let Some(stdout) = c.stdout.take() else {
        fail(&mut c, "no stdout".into())
    };
    let mut out = BufReader::new(stdout);
    let mut line = String::new();
    loop {
        line.clear();
        if out.read_line(&mut line).unwrap_or(0) == 0 {
            fail(&mut c, "exited before listening".into());
        }
        match said(&line) {
            Some("listening") => return (c, out),
            Some(s) => fail(&mut c, format!("said {s:?}, not \"listening\"")),
            None => {}
        }
    }
}

/// The helper's report line, after it exited.
fn report(out: impl Read) -> String {
    BufReader::new(out)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| said(&l).map(str::to_owned))
        .unwrap_or_else(|| "<no report>".into())
}

/// Sends `bytes` from host `from` to a server in host `to`: Ok(seconds) or Err(report).
fn transfer(hosts: &Hosts, from: usize, to: usize, port: u16, bytes: u64) -> Result<f64, String> {
    let (mut server, server_out) = start_server(hosts, to, port);
    let out = helper_cmd(
        hosts,
        from,
        &format!("send {}:{port} {bytes}", hosts.addr(to)),
    )
    .output()
    .expect("run the sender");
    let said = report(&out.stdout[..]);
    if !out.status.success() {
        let _ = server.kill();
        let _ = server.wait();
        return Err(said);
    }
    let st = server.wait().unwrap();
    let server_said = report(server_out);
    assert!(st.success(), "server in host {to}: {server_said}");
    assert!(
        server_said == format!("received {bytes} bytes from {}", hosts.addr(from)),
        "server in host {to}: {server_said}"
    );
    said.strip_prefix(&format!("sent {bytes} in "))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("sender: {said}"))
}

/// Runs `sh -c script` in host `i`: (success, stdout).
fn sh(hosts: &Hosts, i: usize, script: &str) -> (bool, String) {
    let out = hosts
        .command(i, "sh")
        .args(["-c", script])
        .stdin(Stdio::null())
        .output()
        .expect("run sh in a host");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
    )
}

// ---------------------------------------------------------------------------------------------
// The harness
// ---------------------------------------------------------------------------------------------

/// Every host reaches every other one over TCP (in both directions), and sees its own address.
#[test]
fn hosts_reach_each_other() {
    let Some(hosts) = Hosts::new_or_skip(3) else {
        return;
    };
    for from in 0..3 {
        for to in (0..3).filter(|&t| t != from) {
            transfer(&hosts, from, to, 7000 + from as u16, 1 << 20)
                .unwrap_or_else(|e| panic!("host {from} -> host {to}: {e}"));
        }
    }
    for i in 0..3 {
        let (ok, addrs) = sh(&hosts, i, "ip -4 -o addr show");
        assert!(ok);
        assert!(addrs.contains(&format!("{}/24", hosts.addr(i))), "{addrs}");
        assert!(addrs.contains("127.0.0.1"), "loopback is up: {addrs}");
    }
}

/// Each host has its own hostname (not the machine's), the same for all its processes.
#[test]
fn hostnames_differ() {
    let Some(hosts) = Hosts::new_or_skip(2) else {
        return;
    };
    let machine = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let mut seen = Vec::new();
    for i in 0..2 {
        for _ in 0..2 {
            let (ok, name) = sh(&hosts, i, "cat /proc/sys/kernel/hostname");
            assert!(ok);
            assert_eq!(name, hosts.hostname(i), "host {i}");
        }
        seen.push(hosts.hostname(i).to_owned());
    }
    assert_ne!(seen[0], seen[1]);
    assert!(!seen.contains(&machine.trim().to_owned()));
}

/// `/dev/shm` is private to a host: shared by its processes, invisible to other hosts and to
/// the machine.
#[test]
fn shm_is_private_to_a_host() {
    let Some(hosts) = Hosts::new_or_skip(2) else {
        return;
    };
    let name = format!("ampccl-hosts-test.{}", std::process::id());
    let path = format!("/dev/shm/{name}");
    assert!(sh(&hosts, 0, &format!("echo host0 > {path}")).0);
    assert_eq!(
        sh(&hosts, 0, &format!("cat {path}")),
        (true, "host0".into())
    );
    assert!(
        sh(&hosts, 1, &format!("test ! -e {path}")).0,
        "host 1 sees host 0's {path}"
    );
    assert!(
        !std::path::Path::new(&path).exists(),
        "the machine sees host 0's {path}"
    );
}

/// `set_rate` limits a host's link (both directions); `clear_rate` lifts the limit.
#[test]
fn rate_limit() {
    let Some(hosts) = Hosts::new_or_skip(2) else {
        return;
    };
    const BYTES: u64 = 8 << 20;
    // 8 MiB at 100 Mbit/s: at least 0.67 s; take 0.4 s as the bound.
    hosts.set_rate(0, "100mbit").unwrap();
    let out = transfer(&hosts, 0, 1, 7100, BYTES).unwrap();
    assert!(out >= 0.4, "8 MiB out of a 100 Mbit/s host took {out:.3} s");
    let inbound = transfer(&hosts, 1, 0, 7101, BYTES).unwrap();
    assert!(
        inbound >= 0.4,
        "8 MiB into a 100 Mbit/s host took {inbound:.3} s"
    );
    hosts.set_rate(0, "1gbit").unwrap(); // replaces
    hosts.clear_rate(0).unwrap();
    hosts.clear_rate(0).unwrap(); // nothing to clear
    let free = transfer(&hosts, 0, 1, 7102, BYTES).unwrap();
    assert!(free < 0.4, "8 MiB without a limit took {free:.3} s");
    eprintln!("8 MiB: {out:.3} s out, {inbound:.3} s in at 100mbit; {free:.3} s unshaped");
    assert!(hosts.set_rate(0, "fast").is_err());
}

/// `set_congestion_control` sets one host's TCP congestion control, not the machine's or
/// another host's; a name that is not one is refused before it reaches a shell.
#[test]
fn congestion_control_per_host() {
    let Some(hosts) = Hosts::new_or_skip(2) else {
        return;
    };
    let read = |i| sh(&hosts, i, "sysctl -n net.ipv4.tcp_congestion_control");
    let (ok, before) = read(1);
    assert!(ok, "cannot read host 1's congestion control");
    // Another one that a namespace may choose (reno always may, and the machine's default);
    // where reno is the machine's default and the only one allowed, setting it again still
    // shows that host 1 is left alone.
    let allowed = ampccl_tests::hosts::allowed_congestion_controls();
    let other = allowed.iter().find(|a| **a != before).unwrap_or(&before);
    hosts.set_congestion_control(0, other).unwrap();
    assert_eq!(read(0), (true, other.to_owned()));
    assert_eq!(
        read(1),
        (true, before.clone()),
        "host 1 changed with host 0"
    );
    for bad in ["", "cubic;true", "no such"] {
        assert!(
            hosts.set_congestion_control(0, bad).is_err(),
            "{bad:?} accepted"
        );
    }
    assert!(
        hosts.set_congestion_control(0, "nosuchcc").is_err(),
        "a congestion control the kernel lacks was accepted"
    );
}

/// `set_quickack` gives one host's route to the subnet the `quickack` metric, leaves the other
/// hosts' routes alone, and the hosts still reach each other.
#[test]
fn quickack_per_host() {
    let Some(hosts) = Hosts::new_or_skip(2) else {
        return;
    };
    let route = |i| sh(&hosts, i, "ip route show 10.213.0.0/24");
    assert!(!route(0).1.contains("quickack"), "{:?}", route(0));
    hosts.set_quickack(0).unwrap();
    let (ok, shown) = route(0);
    assert!(
        ok && shown.contains("quickack 1"),
        "host 0's route: {shown:?}"
    );
    assert!(
        shown.contains(&format!("src {}", hosts.addr(0))),
        "{shown:?}"
    );
    assert!(
        !route(1).1.contains("quickack"),
        "host 1 changed with host 0"
    );
    transfer(&hosts, 1, 0, 7100, 1 << 20).expect("host 1 -> host 0 after quickack");
    transfer(&hosts, 0, 1, 7101, 1 << 20).expect("host 0 -> host 1 after quickack");
}

/// `link_down` cuts a host off (connects to and from it fail), `link_up` restores it.
#[test]
fn link_down_and_up() {
    let Some(hosts) = Hosts::new_or_skip(2) else {
        return;
    };
    transfer(&hosts, 0, 1, 7200, 1024).expect("before link_down");
    hosts.link_down(1).unwrap();
    let t = Instant::now();
    let e = transfer(&hosts, 0, 1, 7201, 1024).expect_err("connect to a host whose link is down");
    assert!(e.contains("connect"), "{e}");
    let e = transfer(&hosts, 1, 0, 7202, 1024).expect_err("connect from a host whose link is down");
    assert!(e.contains("connect"), "{e}");
    eprintln!("two failed connects took {:.2?}", t.elapsed());
    hosts.link_up(1).unwrap();
    transfer(&hosts, 0, 1, 7203, 1024).expect("after link_up");
    transfer(&hosts, 1, 0, 7204, 1024).expect("after link_up");
}

/// Process ids of `holders` that are still running (zombies count as gone).
fn running(holders: &[u32]) -> Vec<u32> {
    holders
        .iter()
        .copied()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                !s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
        })
        .collect()
}

fn ours(names: &[String]) -> Vec<String> {
    let now = harness_netns();
    names.iter().filter(|n| now.contains(n)).cloned().collect()
}

/// Dropping the hosts (also when a panic unwinds) removes every namespace and holder, and a
/// stale namespace of a dead process is swept by the next `Hosts::new`.
#[test]
fn cleanup() {
    let Some(hosts) = Hosts::new_or_skip(2) else {
        return;
    };
    let names = hosts.netns_names();
    assert_eq!(names.len(), 3);
    assert_eq!(
        ours(&names),
        names,
        "the namespaces exist while the hosts do"
    );
    let holders: Vec<u32> = (0..2).map(|i| hosts.holder_pid(i)).collect();
    let clone = hosts.clone();
    drop(hosts);
    assert_eq!(ours(&names), names, "a clone keeps the hosts");
    drop(clone);
    assert_eq!(ours(&names), Vec::<String>::new(), "left after drop");
    assert_eq!(
        running(&holders),
        Vec::<u32>::new(),
        "holders left after drop"
    );

    // A panic while the hosts exist.
    let (tx, rx) = std::sync::mpsc::channel();
    let r = std::thread::spawn(move || {
        let hosts = Hosts::new(2).unwrap();
        tx.send((hosts.netns_names(), hosts.holder_pid(0))).unwrap();
        hosts.link_down(0).unwrap();
        panic!("test panic with hosts alive");
    })
    .join();
    assert!(r.is_err());
    let (names, holder) = rx.recv().unwrap();
    assert_eq!(ours(&names), Vec::<String>::new(), "left after a panic");
    assert_eq!(running(&[holder]), Vec::<u32>::new());

    // A leftover of a process that is gone.
    let mut dead = Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    let stale = format!("ampccl-hosts-{dead_pid}-0-h0");
    let st = Command::new("ip")
        .args(["netns", "add", &stale])
        .status()
        .unwrap();
    assert!(st.success());
    let hosts = Hosts::new(1).unwrap();
    assert!(!harness_netns().contains(&stale), "stale {stale} not swept");
    drop(hosts);
}

// ---------------------------------------------------------------------------------------------
// Ranks on hosts
// ---------------------------------------------------------------------------------------------

/// Bootstrap only (no data transport): the ranks allgather their hostnames and `/dev/shm`
/// markers and check them against their placement (`AMPCCL_TEST_HOST`) and the host ids.
fn hostnames() -> Outcome {
    let (rank, world) = rank_world();
    ensure(std::env::var_os("AMPCCL_UNIQUE_ID").is_none(), || {
        "a unique id was passed to a rank on an emulated host".into()
    })?;
    let host: usize = std::env::var("AMPCCL_TEST_HOST")
        .ok()
        .and_then(|h| h.parse().ok())
        .ok_or("AMPCCL_TEST_HOST is not set")?;
    let placement: Vec<usize> = std::env::var("PLACEMENT")
        .map_err(|_| "PLACEMENT is not set")?
        .split(',')
        .map(|h| h.parse().unwrap())
        .collect();
    ensure(placement.get(rank) == Some(&host), || {
        format!("rank {rank} runs on host {host}, placement {placement:?}")
    })?;
    // Every rank leaves a marker in its /dev/shm; a rank sees exactly those of its host.
    let marker = format!("/dev/shm/ampccl-hosts-rank{rank}.{}", std::process::id());
    std::fs::write(&marker, b"").map_err(|e| format!("{marker}: {e}"))?;

    let bs = Bootstrap::from_env(Duration::from_secs(20)).map_err(|e| format!("bootstrap: {e}"))?;
    ensure(bs.rank() == rank && bs.world() == world, || {
        format!("bootstrap rank {}/{}", bs.rank(), bs.world())
    })?;
    let me = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let names: Vec<String> = bs
        .allgather(1, me.trim().as_bytes())
        .map_err(|e| format!("allgather: {e}"))?
        .into_iter()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .collect();
    let ids = bs.host_ids();
    for a in 0..world {
        for b in 0..world {
            let same = placement[a] == placement[b];
            ensure((names[a] == names[b]) == same, || {
                format!("ranks {a}, {b}: hostnames {names:?}, placement {placement:?}")
            })?;
            ensure((ids[a] == ids[b]) == same, || {
                format!("ranks {a}, {b}: host ids {ids:x?}, placement {placement:?}")
            })?;
        }
    }
    let local = placement[..rank].iter().filter(|&&h| h == host).count();
    ensure(bs.local_rank() == local, || {
        format!("local rank {}, expected {local}", bs.local_rank())
    })?;
    // All markers are written (the allgather above); see which are here.
    bs.barrier(2).map_err(|e| format!("barrier: {e}"))?;
    let here: Vec<usize> = std::fs::read_dir("/dev/shm")
        .map_err(|e| format!("/dev/shm: {e}"))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.strip_prefix("ampccl-hosts-rank")?
                .split('.')
                .next()?
                .parse()
                .ok()
        })
        .collect();
    let mut here = here;
    here.sort();
    let expect: Vec<usize> = (0..world).filter(|&r| placement[r] == host).collect();
    ensure(here == expect, || {
        format!("/dev/shm of host {host} holds the markers of ranks {here:?}, expected {expect:?}")
    })?;
    bs.barrier(3).map_err(|e| format!("barrier: {e}"))?;
    std::fs::remove_file(&marker).ok();
    eprintln!(
        "rank {rank} (pid {}) on {}: hostnames {names:?}",
        std::process::id(),
        me.trim()
    );
    Ok(())
}

/// Rank 1 (on another host) is killed by the launcher while rank 0 waits for it in a
/// bootstrap barrier: rank 0 fails at once naming it (its connection closed), far before the
/// timeout.
fn peer_killed() -> Outcome {
    let (rank, _) = rank_world();
    let bs = Bootstrap::from_env(Duration::from_secs(20)).map_err(|e| format!("bootstrap: {e}"))?;
    bs.barrier(1).map_err(|e| format!("barrier: {e}"))?;
    if rank == 1 {
        std::thread::sleep(Duration::from_secs(30));
        return Err("rank 1 was not killed".into());
    }
    let t = Instant::now();
    let r = bs.barrier(2);
    let el = t.elapsed();
    match r {
        Err(ampccl::Error::Remote(m)) if m.contains("rank 1") || m.contains("rank(s) 1") => {
            eprintln!("barrier after {el:.2?}: {m}");
            ensure(el < Duration::from_secs(5), || {
                format!("noticed after {el:?}")
            })
        }
        Err(e) => Err(format!("barrier: wrong error {e:?}")),
        Ok(()) => Err("barrier passed without rank 1".into()),
    }
}

fn bootstrap_on(k: usize, placement: &[usize]) {
    let Some(hosts) = Hosts::new_or_skip(k) else {
        return;
    };
    let p: Vec<String> = placement.iter().map(|h| h.to_string()).collect();
    let results = Launch::new(placement.len(), "hostnames")
        .on_hosts(&hosts, placement)
        .env("PLACEMENT", &p.join(","))
        .env("AMPCCL_TIMEOUT_S", "20")
        .deadline(Duration::from_secs(30))
        .run();
    // The launcher's child is the rank itself (nsenter execs it): kills reach the rank.
    for r in results {
        assert!(
            r.stderr
                .contains(&format!("rank {} (pid {}) on ", r.rank, r.pid)),
            "rank {} is not pid {}: {}",
            r.rank,
            r.pid,
            r.stderr
        );
    }
}

#[test]
fn bootstrap_2_hosts_1_rank_each() {
    bootstrap_on(2, &[0, 1]);
}

#[test]
fn bootstrap_2_hosts_2_ranks_each() {
    bootstrap_on(2, &[0, 0, 1, 1]);
}

/// Rank 0 (the root's host) on the last host, ranks interleaved.
#[test]
fn bootstrap_3_hosts_interleaved() {
    bootstrap_on(3, &[2, 0, 1, 2, 0, 1]);
}

/// A rank killed on another host: the peer's bootstrap call fails at once naming it.
#[test]
fn bootstrap_peer_killed_on_other_host() {
    let Some(hosts) = Hosts::new_or_skip(2) else {
        return;
    };
    let results = Launch::new(2, "peer_killed")
        .on_hosts(&hosts, &[0, 1])
        .env("AMPCCL_TIMEOUT_S", "20")
        .kill_after(1, Duration::from_millis(1500))
        .deadline(Duration::from_secs(30))
        .run();
    assert!(
        !results[1].status.success(),
        "rank 1: {}",
        results[1].stderr
    );
}
