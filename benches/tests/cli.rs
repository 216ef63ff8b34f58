//! End-to-end tests of the `ampccl-perf` binary: a 2-rank sweep writing CSV and PNG, with
//! progress on stderr only, the peak-RSS line, and `plot` overlaying CSVs.

use std::path::PathBuf;
use std::process::{Command, Output};

const PNG_MAGIC: &[u8] = b"\x89PNG\r\n\x1a\n";

fn perf(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ampccl-perf"))
        .args(args)
        .output()
        .expect("ampccl-perf starts")
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ampccl-perf-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn sweep_writes_csv_png_rss_and_progress_on_stderr_only() {
    let d = scratch("sweep");
    let (csv, png) = (d.join("run.csv"), d.join("run.png"));
    let out = perf(&[
        "-g",
        "2",
        "-b",
        "8",
        "-e",
        "1K",
        "-n",
        "3",
        "-w",
        "1",
        "--progress",
        "--csv",
        csv.to_str().unwrap(),
        "--plot",
        png.to_str().unwrap(),
    ]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // 8 B .. 1 KiB: 8 sizes, numbered on stderr, never on stdout.
    assert!(stderr.contains("[1/8] 8 B allreduce"), "{stderr}");
    assert!(stderr.contains("[8/8] 1 KiB allreduce"), "{stderr}");
    assert!(!stdout.contains("[1/8]"), "{stdout}");
    let rss = stdout
        .lines()
        .find(|l| l.starts_with("# Peak RSS per rank"))
        .unwrap_or_else(|| panic!("no RSS line in {stdout}"));
    assert!(
        rss.contains("r0 ") && rss.contains("r1 ") && rss.contains("(3 KiB)"),
        "{rss}"
    );
    let rows = std::fs::read_to_string(&csv).unwrap();
    let mut lines = rows.lines();
    assert!(lines.next().unwrap().starts_with("collective,ranks,bytes"));
    let data: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(data.len(), 16);
    assert!(
        data.iter()
            .all(|f| f[0] == "allreduce" && f[1] == "2" && f[11] == "0")
    );
    let png = std::fs::read(&png).unwrap();
    assert!(png.len() > 1000 && png.starts_with(PNG_MAGIC));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_bad_overlay_fails_before_the_sweep() {
    let d = scratch("overlay");
    let png = d.join("never.png");
    let out = perf(&[
        "-g",
        "2",
        "-b",
        "8",
        "-e",
        "8",
        "--plot",
        png.to_str().unwrap(),
        "--overlay",
        d.join("missing.csv").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("cannot read"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        !text(&out.stdout).contains("# Out of bounds"),
        "{}",
        text(&out.stdout)
    );
    assert!(!png.exists());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn no_progress_when_stderr_is_not_a_terminal() {
    let out = perf(&["-g", "1", "-b", "8", "-e", "64", "-n", "1", "-w", "0"]);
    assert!(out.status.success());
    assert!(!text(&out.stderr).contains("[1/"), "{}", text(&out.stderr));
}

#[test]
fn plot_overlays_csvs_and_rejects_foreign_files() {
    let d = scratch("plot");
    let header =
        "collective,ranks,bytes,count,type,redop,root,placement,time_us,algbw_gbs,busbw_gbs,wrong";
    for (name, bw) in [("ampccl", 8.0), ("intel-mpi", 6.0)] {
        let mut s = format!("{header}\n");
        for k in 3..=26 {
            let b = 1usize << k;
            s += &format!(
                "allreduce,2,{b},{},float,sum,-1,out,1.0,{bw},{bw},0\n",
                b / 4
            );
        }
        std::fs::write(d.join(format!("{name}.csv")), s).unwrap();
    }
    let png = d.join("cmp.png");
    let out = perf(&[
        "plot",
        "--out",
        png.to_str().unwrap(),
        d.join("ampccl.csv").to_str().unwrap(),
        d.join("intel-mpi.csv").to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(std::fs::read(&png).unwrap().starts_with(PNG_MAGIC));

    std::fs::write(d.join("bad.csv"), "bytes,time\n8,1\n").unwrap();
    let out = perf(&[
        "plot",
        "--out",
        png.to_str().unwrap(),
        d.join("bad.csv").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("not an ampccl-perf CSV"),
        "{}",
        text(&out.stderr)
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// Runs `ampccl-perf ceiling` with short iteration counts and returns its table rows (split into
/// fields) after checking the exit code, the header and that no element is wrong.
fn ceiling_rows(extra: &[&str]) -> Vec<Vec<String>> {
    let mut args = vec!["ceiling", "-n", "3", "-w", "1"];
    args.extend_from_slice(extra);
    let out = perf(&args);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{args:?}\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("2-thread ") && stdout.contains("0 OK"),
        "{stdout}"
    );
    let rows: Vec<Vec<String>> = stdout
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect();
    // size count type redop root time min algbw busbw #wrong
    assert!(
        rows.iter().all(|f| f.len() == 10 && f[9] == "0"),
        "{stdout}"
    );
    rows
}

#[test]
fn ceiling_measures_every_collective_and_checks_it() {
    for (op, redop, root) in [
        ("allreduce", "sum", "-1"),
        ("allgather", "none", "-1"),
        ("reducescatter", "sum", "-1"),
        ("broadcast", "none", "0"),
    ] {
        let rows = ceiling_rows(&["-o", op, "-b", "1K", "-e", "64K", "-f", "8"]);
        let sizes: Vec<&str> = rows.iter().map(|f| f[0].as_str()).collect();
        assert_eq!(sizes, ["1024", "8192", "65536"], "{op}");
        assert!(
            rows.iter()
                .all(|f| f[2] == "float" && f[3] == redop && f[4] == root),
            "{op}: {rows:?}"
        );
    }
    // Allgather's large schedule (4 MiB per rank: streaming copies straight from the input).
    let rows = ceiling_rows(&["-o", "allgather", "-b", "8M", "-e", "8M"]);
    assert_eq!(rows.len(), 1);
}

#[test]
fn staged_ceiling_checks_a_broadcast_through_the_ring() {
    // One chunk, two halves, and 9 MiB of int8: 18 chunks, twice round the 8-slot ring, and
    // the warm-up and timed iterations go on where the last stopped.
    let rows = ceiling_rows(&[
        "-o",
        "broadcast",
        "--staged",
        "-d",
        "int8",
        "-b",
        "100K",
        "-e",
        "9M",
        "-f",
        "3",
    ]);
    let sizes: Vec<&str> = rows.iter().map(|f| f[0].as_str()).collect();
    assert_eq!(sizes, ["102400", "307200", "921600", "2764800", "8294400"]);
    let out = perf(&["ceiling", "-o", "allreduce", "--staged", "-e", "1K"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--staged"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn ceiling_int8_max_writes_csv() {
    let d = scratch("ceiling");
    let csv = d.join("ceiling.csv");
    let rows = ceiling_rows(&[
        "-o",
        "allreduce",
        "-d",
        "int8",
        "-r",
        "max",
        "-b",
        "1K",
        "-e",
        "64K",
        "-f",
        "8",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    assert!(rows.iter().all(|f| f[2] == "int8" && f[3] == "max"));
    let text = std::fs::read_to_string(&csv).unwrap();
    let data: Vec<Vec<&str>> = text
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    assert_eq!(data.len(), 3);
    assert!(
        data.iter()
            .all(|f| f[0] == "allreduce" && f[1] == "2" && f[7] == "out" && f[11] == "0")
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn ceiling_rejects_collectives_it_does_not_model() {
    let out = perf(&["ceiling", "-o", "alltoall", "-e", "1K"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("ceiling: unknown collective"));
}

/// Without `-g` and without a launcher's environment, the error says how to run it.
#[test]
fn without_ranks_the_error_suggests_g() {
    let out = Command::new(env!("CARGO_BIN_EXE_ampccl-perf"))
        .args(["-b", "8", "-e", "8"])
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("MASTER_ADDR")
        .env_remove("AMPCCL_UNIQUE_ID")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("-g N starts N ranks"), "{err}");
}
