//! Malformed, truncated and fuzzed files: every one refused with a message, none panics.

use super::*;

fn refused(text: &str, kind: TuningErrorKind, says: &str) {
    let e = Tuning::parse(text).expect_err(says);
    assert_eq!(e.kind, kind, "{e}");
    assert!(e.to_string().contains(says), "{e} should say {says:?}");
}

#[test]
fn malformed_files_are_refused_by_name() {
    use TuningErrorKind::*;
    let good = sample().to_text();
    let with = |from: &str, to: &str| {
        assert!(good.contains(from), "{from}");
        good.replacen(from, to, 1)
    };
    refused("", NotTuning, "empty");
    refused("# nothing\n\n", NotTuning, "empty");
    refused("hello\n", NotTuning, "not a tuning file");
    refused(&with(" v1\n", " v0\n"), Version, "format v0 is an older format");
    refused(&with(" v1\n", " v2\n"), Version, "format v2 is a newer format");
    refused(&with(" v1\n", " vx\n"), Syntax, "no version number");
    refused(&with("machine: gpu-node-7\n", ""), Syntax, "expected the 'machine:' line, found 'driver:");
    refused(&with("machine: gpu-node-7", "machine:"), Syntax, "'machine:' is empty");
    refused(
        &with("gpu: 0000:17:00.0 NVIDIA H200\ngpu: 0000:3d:00.0 NVIDIA H200\n", ""),
        Syntax,
        "expected the 'gpu:' line",
    );
    refused(&with("gpu: 0000:17:00.0 NVIDIA H200", "gpu: 0000:17:00.0"), Syntax, "a PCI bus id and a name");
    refused(&with("links: pcie", "links: infiniband"), Syntax, "not same-device, nvlink or pcie");
    refused(&with("links: pcie", "links: no-peer"), Table, "nothing to tune");
    refused(&with("upto=32768 lamport", "upto=32768 fastshot"), Syntax, "'fastshot' is not a way");
    refused(&with("upto=32768 lamport", "upto=32768 fused:lamport"), Syntax, "is not a way (lamport");
    refused(&with("upto=1048576 split:oneshot", "upto=1048576 split:fourshot"), Syntax, "not a way");
    refused(&with("upto=1048576 split:oneshot", "upto=1048576 oneshot"), Syntax, "not a way");
    refused(&with("upto=32768 lamport", "upto=32x68 lamport"), Syntax, "upto=32x68: not a byte count");
    refused(&with("upto=32768 lamport", "upto=-5 lamport"), Syntax, "not a byte count");
    refused(&with("upto=32768 lamport", "upto=0 lamport"), Syntax, "not a byte count");
    refused(&with("upto=32768 lamport", "upto=18446744073709551615 lamport"), Syntax, "not a byte count");
    refused(&with("upto=32768 lamport", "upto=99999999999999999999 lamport"), Syntax, "not a byte count");
    refused(&with("upto=32768 lamport", "upto=17179869184G lamport"), Syntax, "not a byte count");
    refused(&with("upto=32768 lamport", "upto= lamport"), Syntax, "not a byte count");
    refused(
        &with("plain ranks=2 dtype=any upto=32768", "plain ranks=two dtype=any upto=32768"),
        Syntax,
        "not a rank count",
    );
    refused(
        &with("plain ranks=2 dtype=any upto=32768", "plain ranks=3 dtype=any upto=32768"),
        Table,
        "ranks=3: the kernels exist for",
    );
    refused(&with("plain ranks=2 dtype=any upto=32768", "plain ranks=2 dtype=int8 upto=32768"), Syntax, "dtype=int8");
    refused(
        &with("plain ranks=2 dtype=any upto=32768", "plain ranks=2 type=any upto=32768"),
        Syntax,
        "expected dtype=",
    );
    refused(&with("rows=wide upto=16384", "rows=huge upto=16384"), Syntax, "rows=huge");
    refused(
        &with("rows=wide upto=16384", "upto=16384"),
        Syntax,
        "expected 'fused ranks=... dtype=... rows=... upto=... <way>'",
    );
    refused(
        &with("plain ranks=2 dtype=any upto=32768 lamport", "plain ranks=2 dtype=any upto=32768 lamport extra"),
        Syntax,
        "expected 'plain",
    );
    refused(
        &with("plain ranks=2 dtype=any upto=32768", "broadcast ranks=2 dtype=any upto=32768"),
        Syntax,
        "is not a row",
    );
    refused(
        &with("upto=4194304 oneshot", "upto=16384 oneshot"),
        Table,
        "upto=16384 after upto=32768: the bounds must increase",
    );
    refused(&with("upto=4194304 oneshot", "upto=32768 oneshot"), Table, "the bounds must increase");
    refused(
        &with("plain ranks=4 dtype=any upto=max nccl", "plain ranks=4 dtype=any upto=65536 nccl"),
        Table,
        "it must be upto=max",
    );
    refused(&with("end rows=10", "end rows=9"), Truncated, "counts 9 rows and 1 grid lines, the file has 10 and 1");
    refused(&with("grids=1", "grids=0"), Truncated, "counts 10 rows and 0 grid lines, the file has 10 and 1");
    refused(&with("end rows=10", "end"), Syntax, "expected 'end rows=<count>'");
    refused(
        &with("end rows=10 grids=1\n", "end rows=10 grids=1\nplain ranks=8 dtype=any upto=max nccl\n"),
        Syntax,
        "after the end line",
    );
    refused(&good.replace("end rows=10 grids=1\n", ""), Truncated, "cut short");
    refused(
        &with("gpu: 0000:3d:00.0 NVIDIA H200", "gpu: 0000:17:00.0 NVIDIA H200"),
        Syntax,
        "the GPUs are listed once each, by bus id",
    );
    // A section in two places.
    let twice = good.replace("end rows=10", "plain ranks=2 dtype=any upto=max nccl\nend rows=11");
    refused(&twice, Table, "the rows of plain ranks=2 dtype=any are in two places (line 9) and (line 19)");
}

/// What the loader does with a file's text on the machine of [`machine`]: parse, then check.
fn loaded(text: &str) -> Result<Tuning, TuningError> {
    let t = Tuning::parse(text)?;
    t.check(&machine())?;
    Ok(t)
}

/// The fuzz: every prefix of a good file, every line deleted, doubled, swapped with the next,
/// its numbers garbled, and lines of other versions, builds and families. Each is refused
/// with a message (so the loader warns once and keeps the built-in tables), none panics.
/// The one kind of change that keeps a valid file is a swap of two sections of one row
/// each: the same tables in another order, accepted as such.
#[test]
fn fuzzed_files_are_all_refused() {
    let good = sample().to_text();
    let lines: Vec<&str> = good.lines().collect();
    let mut cases: Vec<(String, String)> = Vec::new();
    for cut in 0..good.len() {
        // Cut anywhere (mid-line too); only the final newline may go.
        if good.is_char_boundary(cut) && !good[cut..].trim().is_empty() {
            cases.push((format!("the first {cut} bytes"), good[..cut].to_owned()));
        }
    }
    let join = |ls: &[&str]| ls.iter().map(|l| format!("{l}\n")).collect::<String>();
    for i in 0..lines.len() {
        let mut deleted = lines.clone();
        deleted.remove(i);
        cases.push((format!("line {} deleted", i + 1), join(&deleted)));
        let mut doubled = lines.clone();
        doubled.insert(i, lines[i]);
        cases.push((format!("line {} doubled", i + 1), join(&doubled)));
        if i + 1 < lines.len() {
            let mut swapped = lines.clone();
            swapped.swap(i, i + 1);
            cases.push((format!("lines {} and {} swapped", i + 1, i + 2), join(&swapped)));
        }
        for bad in ["x", "-1", "99999999999999999999999", ""] {
            if lines[i].contains('=') {
                let garbled = lines[i].replace(|c: char| c.is_ascii_digit(), "").replace('=', &format!("={bad}"));
                let mut g = lines.clone();
                g[i] = &garbled;
                cases.push((format!("line {} numbers as '{bad}'", i + 1), join(&g)));
            }
        }
    }
    for (from, to) in [
        (" v1\n", " v0\n"),
        (" v1\n", " v2\n"),
        ("library: ", "library: 0.0.1 EAR7 "),
        ("machine: gpu-node-7", "machine: other"),
        ("lamport", "lampord"),
        ("split:oneshot", "split:threeshot"),
        ("dtype=bf16", "dtype=bf17"),
        ("upto=32768", "upto=32768.5"),
    ] {
        cases.push((format!("'{from}' as '{to}'"), good.replacen(from, to, 1)));
    }
    let reordered = |t: &Tuning| {
        let mut a = t.sections.clone();
        let mut b = sample().sections;
        a.sort_by_key(|s| s.key.to_string());
        b.sort_by_key(|s| s.key.to_string());
        a == b && t.fingerprint() == sample().fingerprint()
    };
    let (mut refusals, mut reorders) = (0, 0);
    for (what, text) in &cases {
        let outcome =
            std::panic::catch_unwind(|| loaded(text)).unwrap_or_else(|_| panic!("{what}: the parser panicked"));
        match outcome {
            Err(e) => {
                assert!(!e.message.is_empty(), "{what}: a refusal without a message");
                refusals += 1;
            }
            Ok(t) => {
                assert!(what.contains("swapped") && reordered(&t), "{what}: accepted:\n{text}");
                reorders += 1;
            }
        }
    }
    assert_eq!(reorders, 1, "the two one-row sections at the end, swapped");
    assert!(refusals > good.len(), "{refusals} refusals of {} cases", cases.len());
}
