//! `ampccl-hosts`: runs a program as the ranks of a job spread over emulated hosts on this
//! machine (network namespaces on a bridge, a private `/dev/shm` each; see `docs/TESTING.md`),
//! or measures the TCP ceiling between two of them. Needs root.
//!
//! ```text
//! ampccl-hosts [-k HOSTS] [-r RANKS_PER_HOST] [--rate RATE] [--tcp-cc NAME] [--quickack]
//!              -- PROGRAM ARGS...
//! ampccl-hosts --ceiling [--rate RATE] [--tcp-cc NAME] [--streams N] [--mib M]
//! ampccl-hosts --iperf3 "IPERF3 CLIENT ARGS" [--rate RATE] [--tcp-cc NAME]
//! ```
//!
//! Ranks get torchrun's variables (`MASTER_ADDR` = host 0's address, `MASTER_PORT`, `RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`) and a job token; rank 0's output goes to standard output, every
//! other rank's standard error is prefixed with its rank. `--rate` shapes every host's link with
//! `tc tbf` (e.g. `5gbit`); `--tcp-cc` sets every host's TCP congestion control (e.g. `cubic`;
//! by default the hosts take this machine's); `--quickack` makes every host acknowledge each TCP
//! segment at once (`Hosts::set_quickack`, for latency comparisons). `--ceiling` sends `--mib`
//! MiB over `--streams` TCP connections from host 1 to host 0 and prints the rate: what one link
//! between two such hosts carries.
//! `--iperf3` runs an `iperf3` server in host 0 and `iperf3 -c <host 0> ARGS` in host 1 (e.g.
//! `"-t 5"`, `"-t 5 -P 4"`, `"-t 5 --bidir"`) and prints iperf3's summary lines.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{ExitCode, Stdio};
use std::time::Instant;

use ampccl_tests::{Hosts, free_port};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("stream-recv") {
        return stream_recv(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("stream-send") {
        return stream_send(&args[1..]);
    }
    match run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ampccl-hosts: {e}");
            ExitCode::from(2)
        }
    }
}

/// Options before `--`.
struct Opts {
    hosts: usize,
    per_host: usize,
    rate: Option<String>,
    tcp_cc: Option<String>,
    quickack: bool,
    ceiling: bool,
    streams: usize,
    mib: usize,
    iperf3: Option<String>,
}

fn parse(args: &[String]) -> Result<(Opts, Vec<String>), String> {
    let mut o = Opts {
        hosts: 2,
        per_host: 1,
        rate: None,
        tcp_cc: None,
        quickack: false,
        ceiling: false,
        streams: 1,
        mib: 1024,
        iperf3: None,
    };
    let mut it = args.iter();
    let mut program = Vec::new();
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        let number = |v: String, name: &str| {
            v.parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("{name} {v:?}: expected a positive integer"))
        };
        match a.as_str() {
            "-k" => o.hosts = number(value("-k")?, "-k")?,
            "-r" => o.per_host = number(value("-r")?, "-r")?,
            "--rate" => o.rate = Some(value("--rate")?),
            "--tcp-cc" => o.tcp_cc = Some(value("--tcp-cc")?),
            "--quickack" => o.quickack = true,
            "--ceiling" => o.ceiling = true,
            "--streams" => o.streams = number(value("--streams")?, "--streams")?,
            "--mib" => o.mib = number(value("--mib")?, "--mib")?,
            "--iperf3" => o.iperf3 = Some(value("--iperf3")?),
            "--" => {
                program = it.cloned().collect();
                break;
            }
            other => return Err(format!("unknown option {other:?} (see the module docs)")),
        }
    }
    if !o.ceiling && o.iperf3.is_none() && program.is_empty() {
        return Err(
            "usage: ampccl-hosts [-k HOSTS] [-r RANKS_PER_HOST] [--rate R] [--tcp-cc C] \
             [--quickack] -- PROGRAM ARGS... | --ceiling"
                .into(),
        );
    }
    Ok((o, program))
}

fn run(args: &[String]) -> Result<ExitCode, String> {
    let (o, program) = parse(args)?;
    let two = o.ceiling || o.iperf3.is_some();
    let hosts = Hosts::new(if two { 2 } else { o.hosts })?;
    for i in 0..hosts.len() {
        if let Some(rate) = &o.rate {
            hosts.set_rate(i, rate)?;
        }
        if let Some(cc) = &o.tcp_cc {
            hosts.set_congestion_control(i, cc)?;
        }
        if o.quickack {
            hosts.set_quickack(i)?;
        }
    }
    if o.ceiling {
        return ceiling(&hosts, o.streams, o.mib);
    }
    if let Some(args) = &o.iperf3 {
        return iperf3(&hosts, args);
    }
    let world = o.hosts * o.per_host;
    let (port, token) = (free_port(), format!("ampccl-hosts-{}", std::process::id()));
    let mut children = Vec::with_capacity(world);
    for rank in 0..world {
        let host = rank / o.per_host;
        let mut cmd = hosts.command(host, &program[0]);
        cmd.args(&program[1..])
            .env("MASTER_ADDR", hosts.addr(0).to_string())
            .env("MASTER_PORT", port.to_string())
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_RANK", (rank % o.per_host).to_string())
            .env("AMPCCL_TOKEN", &token);
        if rank != 0 {
            cmd.stdout(Stdio::null());
        }
        children.push(
            cmd.spawn()
                .map_err(|e| format!("start rank {rank} on host {host}: {e}"))?,
        );
    }
    let mut worst = 0u8;
    for (rank, mut c) in children.into_iter().enumerate() {
        let st = c.wait().map_err(|e| format!("wait for rank {rank}: {e}"))?;
        if !st.success() {
            eprintln!("ampccl-hosts: rank {rank} ended with {st}");
            worst = worst.max(st.code().unwrap_or(1).clamp(1, 255) as u8);
        }
    }
    Ok(ExitCode::from(worst))
}

/// The TCP ceiling between host 1 (sender) and host 0 (receiver): this program's own
/// `stream-recv` and `stream-send`, run inside the hosts.
fn ceiling(hosts: &Hosts, streams: usize, mib: usize) -> Result<ExitCode, String> {
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let port = free_port();
    let mut recv = hosts.command(0, &me);
    recv.args([
        "stream-recv",
        &port.to_string(),
        &streams.to_string(),
        &mib.to_string(),
    ]);
    let mut recv = recv
        .spawn()
        .map_err(|e| format!("start the receiver: {e}"))?;
    let mut send = hosts.command(1, &me);
    send.args([
        "stream-send",
        &format!("{}:{port}", hosts.addr(0)),
        &streams.to_string(),
        &mib.to_string(),
    ]);
    let sent = send.status().map_err(|e| format!("run the sender: {e}"))?;
    let got = recv
        .wait()
        .map_err(|e| format!("wait for the receiver: {e}"))?;
    Ok(if sent.success() && got.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// iperf3 from host 1 (client, `args`) to host 0 (server, one test): the summary lines.
fn iperf3(hosts: &Hosts, args: &str) -> Result<ExitCode, String> {
    let port = free_port().to_string();
    let mut server = hosts.command(0, "iperf3");
    server.args(["-s", "-1", "-p", &port]).stdout(Stdio::null());
    let mut server = server
        .spawn()
        .map_err(|e| format!("start iperf3 (is it installed?): {e}"))?;
    let addr = hosts.addr(0).to_string();
    let out = loop {
        let out = hosts
            .command(1, "iperf3")
            .args(["-c", &addr, "-p", &port, "-f", "g"])
            .args(args.split_whitespace())
            .output()
            .map_err(|e| format!("run iperf3: {e}"))?;
        let text = String::from_utf8_lossy(&out.stderr).into_owned();
        // The server may not listen yet.
        if out.status.success() || !text.contains("Connection refused") {
            break out;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    if !out.status.success() {
        // The server saw no test and would wait for one forever.
        let _ = server.kill();
    }
    let _ = server.wait();
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text
        .lines()
        .filter(|l| l.contains("sender") || l.contains("receiver"))
    {
        println!("iperf3 {args}: {}", line.trim());
    }
    if !out.status.success() {
        return Err(format!(
            "iperf3 failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(ExitCode::SUCCESS)
}

/// Accepts `streams` connections, receives `mib` MiB over them, prints the rate.
fn stream_recv(a: &[String]) -> ExitCode {
    let (port, streams, mib) = (num(&a[0]), num(&a[1]), num(&a[2]));
    let l = TcpListener::bind(("0.0.0.0", port as u16)).expect("bind");
    let conns: Vec<TcpStream> = (0..streams)
        .map(|_| l.accept().expect("accept").0)
        .collect();
    let t0 = Instant::now();
    let per = (mib << 20) / streams;
    std::thread::scope(|s| {
        for mut c in conns {
            s.spawn(move || {
                let mut buf = vec![0u8; 1 << 20];
                let mut left = per;
                while left > 0 {
                    let n = c.read(&mut buf[..left.min(1 << 20)]).expect("read");
                    assert!(n > 0, "the sender stopped early");
                    left -= n;
                }
            });
        }
    });
    let s = t0.elapsed().as_secs_f64();
    println!(
        "tcp ceiling: {streams} stream(s), {mib} MiB in {s:.3} s: {:.2} GB/s ({:.1} Gbit/s)",
        (per * streams) as f64 / s / 1e9,
        (per * streams) as f64 * 8.0 / s / 1e9
    );
    ExitCode::SUCCESS
}

/// Connects `streams` times to the receiver and sends `mib` MiB over them.
fn stream_send(a: &[String]) -> ExitCode {
    let (addr, streams, mib) = (&a[0], num(&a[1]), num(&a[2]));
    let per = (mib << 20) / streams;
    let conns: Vec<TcpStream> = (0..streams)
        .map(|_| {
            loop {
                if let Ok(c) = TcpStream::connect(addr.as_str()) {
                    break c;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        })
        .collect();
    std::thread::scope(|s| {
        for mut c in conns {
            s.spawn(move || {
                let buf = vec![7u8; 1 << 20];
                let mut left = per;
                while left > 0 {
                    let n = left.min(buf.len());
                    c.write_all(&buf[..n]).expect("write");
                    left -= n;
                }
            });
        }
    });
    ExitCode::SUCCESS
}

fn num(s: &str) -> usize {
    s.parse().expect("a number")
}
