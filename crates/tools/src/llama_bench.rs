//! llama.cpp's own benchmark (`llama-bench`), run by `bench model --llama-bench PATH` in the same
//! run, on the same GGUF, with the same prompt and decode lengths, thread counts and
//! repetitions. Speed ratios are only meaningful between figures measured on one machine at one
//! time (these machines are noisy), so `bench model` prints a ratio only against these.

use std::path::Path;
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

use crate::ToolError;

/// What the output is, in errors about it.
const OUTPUT: &str = "reading llama-bench's `-o json` output";

/// One test of `llama-bench -o json` (the fields used here; the others are ignored). A
/// prompt-processing test has `n_gen` 0 (llama.cpp's `ppN`), a generation test `n_prompt` 0
/// (`tgN`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlamaBenchTest {
    pub build_commit: String,
    pub n_threads: usize,
    pub n_prompt: usize,
    pub n_gen: usize,
    /// Tokens already in the context before the test (`-d`); 0 unless asked for.
    #[serde(default)]
    pub n_depth: usize,
    /// Tokens per second, mean of the repetitions.
    pub avg_ts: f64,
    pub stddev_ts: f64,
}

/// Parses llama-bench's `-o json` output: one JSON array of tests.
#[cfg(test)]
pub fn parse(json: &str) -> Result<Vec<LlamaBenchTest>, ToolError> {
    parse_as(json, OUTPUT.to_string())
}

/// Parses llama-bench's `-o json` output, the error saying `what` the output was.
fn parse_as(json: &str, what: String) -> Result<Vec<LlamaBenchTest>, ToolError> {
    serde_json::from_str(json).map_err(ToolError::json(what))
}

/// Runs `bin` on `model`: a `pp{prompt}` and a `tg{decode}` test at each of `threads` and
/// `depths`, `reps` repetitions each, as `bench model` measures itself (one sequence, F16 KV:
/// llama-bench's default cache type).
pub fn run(
    bin: &Path,
    model: &Path,
    threads: &[usize],
    depths: &[usize],
    prompt: usize,
    decode: usize,
    reps: usize,
) -> Result<Vec<LlamaBenchTest>, ToolError> {
    let list = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    let mut cmd = Command::new(bin);
    cmd.arg("-m").arg(model).args(["-p", &prompt.to_string(), "-n", &decode.to_string(), "-t", &list(threads)]);
    if depths.iter().any(|d| *d > 0) {
        cmd.args(["-d", &list(depths)]);
    }
    let out = cmd
        .args(["-r", &reps.max(1).to_string(), "-o", "json"])
        .stdin(Stdio::null())
        .output()
        .map_err(ToolError::process(format!("running llama-bench at {}", bin.display())))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(5).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(ToolError::Exited { program: bin.to_path_buf(), status: out.status, stderr_tail: tail.join("\n") });
    }
    parse_as(&String::from_utf8_lossy(&out.stdout), format!("from {}: {OUTPUT}", bin.display()))
}

/// llama.cpp's `pp{prompt}` and `tg{decode}` tokens/s at `threads` and `depth`, when it
/// measured both.
pub fn figures(
    tests: &[LlamaBenchTest],
    threads: usize,
    depth: usize,
    prompt: usize,
    decode: usize,
) -> Option<(f64, f64)> {
    let find = |p: usize, g: usize| {
        tests
            .iter()
            .find(|t| t.n_threads == threads && t.n_prompt == p && t.n_gen == g && t.n_depth == depth)
            .map(|t| t.avg_ts)
    };
    Some((find(prompt, 0)?, find(0, decode)?))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Real llama-bench output (a copy of `../shared/reference/llama_bench.json`): pp128,
    /// pp512 and tg128 at 1 and 2 threads.
    const SAMPLE: &str = include_str!("../../../reference/llama_bench.json");

    #[test]
    fn real_llama_bench_json_gives_pp_and_tg_per_thread_count() {
        let tests = parse(SAMPLE).unwrap();
        assert_eq!(tests.len(), 6);
        assert!(tests.iter().all(|t| t.build_commit == "0c1e570" && t.n_depth == 0));
        assert_eq!(figures(&tests, 1, 0, 512, 128), Some((145.168199, 53.509262)));
        assert_eq!(figures(&tests, 2, 0, 512, 128), Some((283.641028, 124.268256)));
        assert_eq!(figures(&tests, 2, 0, 128, 128), Some((281.353805, 124.268256)));
        // Shapes it did not measure have no figure, so no ratio is printed for them.
        assert_eq!(figures(&tests, 4, 0, 512, 128), None);
        assert_eq!(figures(&tests, 1, 0, 256, 128), None);
        assert_eq!(figures(&tests, 1, 0, 512, 64), None);
        assert_eq!(figures(&tests, 1, 2048, 512, 128), None);
    }

    #[test]
    fn output_that_is_not_llama_bench_json_is_an_error_naming_the_format() {
        for bad in ["", "| model | size |", "{\"avg_ts\": 1}", "[{\"n_threads\": 1}]"] {
            let e = crate::error::chain(&parse(bad).unwrap_err());
            assert!(e.contains("llama-bench's `-o json` output"), "{e}");
        }
    }

    /// A stand-in for llama-bench (none is built here): a script that records its arguments
    /// and answers with the real sample, or fails the way llama-bench does.
    fn stand_in(name: &str, body: &str) -> std::path::PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("pw-llama-bench-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("sample.json"), SAMPLE).unwrap();
        let bin = dir.join("llama-bench");
        std::fs::write(&bin, format!("#!/bin/sh\ncd {}\n{body}\n", dir.display())).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        bin
    }

    #[test]
    fn llama_bench_is_asked_for_our_lengths_threads_and_reps_as_json() {
        let bin = stand_in("ok", r#"echo "$@" > args; echo 'load_backend: loaded CPU' >&2; cat sample.json"#);
        let got = run(&bin, Path::new("/models/m.gguf"), &[1, 2], &[0], 512, 128, 3).unwrap();
        let args = std::fs::read_to_string(bin.with_file_name("args")).unwrap();
        assert_eq!(args.trim(), "-m /models/m.gguf -p 512 -n 128 -t 1,2 -r 3 -o json");
        assert_eq!(got, parse(SAMPLE).unwrap());
        run(&bin, Path::new("/models/m.gguf"), &[1], &[0, 2048], 512, 128, 1).unwrap();
        let args = std::fs::read_to_string(bin.with_file_name("args")).unwrap();
        assert_eq!(args.trim(), "-m /models/m.gguf -p 512 -n 128 -t 1 -d 0,2048 -r 1 -o json");
    }

    #[test]
    fn a_failing_llama_bench_is_an_error_with_its_last_words() {
        let bin = stand_in("fails", "echo 'error: failed to load model' >&2; exit 1");
        let e = crate::error::chain(&run(&bin, Path::new("m.gguf"), &[1], &[0], 512, 128, 1).unwrap_err());
        assert!(e.contains("failed to load model") && e.contains("exit status: 1"), "{e}");
    }

    #[test]
    fn a_missing_llama_bench_binary_is_an_error_naming_its_path() {
        let e = run(Path::new("/nonexistent/llama-bench"), Path::new("m.gguf"), &[1], &[0], 512, 128, 1).unwrap_err();
        let e = crate::error::chain(&e);
        assert!(e.contains("/nonexistent/llama-bench"), "{e}");
    }
}
