#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `pagewarden bench transfer` as a user runs it: the real binary spawning its receiving
//! process over loopback TCP. Speed is never asserted, only that every mode moved the bytes
//! and that the receivers of the MAC'd and the encrypted protocols verified every frame sent.

use std::process::Command;

use serde_json::Value;

#[test]
fn transfer_bench_reports_every_mode_and_verifies_every_frame_it_sends() {
    let out = Command::new(env!("CARGO_BIN_EXE_pagewarden"))
        .args(["bench", "transfer", "--json", "--mib", "16", "--reps", "1"])
        .output()
        .expect("run pagewarden");
    assert!(out.status.success(), "bench failed: {}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let frames = report["frames_per_run"].as_u64().unwrap();
    assert_eq!(frames, (16u64 << 20).div_ceil(368_640), "one frame per 368,640-byte KV page");
    assert_eq!(report["payload_bytes_per_frame"], 368_640);
    let modes = report["modes"].as_array().unwrap();
    for name in ["raw", "framed", "mac", "encrypted"] {
        let m = modes.iter().find(|m| m["mode"] == name).unwrap_or_else(|| panic!("mode {name} missing"));
        assert!(m["gib_per_s"].as_f64().unwrap() > 0.0, "{name}: {m}");
        if name != "raw" {
            // Every KV frame and the close, as sent.
            assert_eq!(m["frames_sent"].as_u64(), Some(frames + 1), "{name}");
            assert_eq!(m["frames_received"].as_u64(), Some(frames + 1), "{name}");
        }
        if name == "mac" || name == "encrypted" {
            assert_eq!(m["frames_verified"].as_u64(), Some(frames + 1), "{name}: every frame verified");
        }
    }
    for ratio in ["framed_over_raw", "mac_over_raw", "encrypted_over_raw", "encryption_cost"] {
        assert!(report["ratios"][ratio].is_f64(), "{ratio}");
    }
    for rate in ["seal_gib_per_s", "open_gib_per_s", "blake3_mac_gib_per_s", "handshake_us"] {
        assert!(report["in_process"][rate].as_f64().unwrap() > 0.0, "{rate}");
    }
}
