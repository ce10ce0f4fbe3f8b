//! Test data from a pinned PyPI source distribution: a few members extracted into the cache.
//!
//! The tokenizer's exactness tests compare against llama.cpp's own test vectors (vocab-only GGUF
//! files with inputs and llama.cpp's ids), which llama.cpp ships in its repository and which the
//! llama-cpp-python sdist vendors. PyPI is the only registry reachable from CI, so the sdist is
//! downloaded with pip (pinned by version and by its SHA-256), only the named members are
//! extracted (Python's tarfile, streamed, written under names of our choosing, never the
//! archive's), and each is checked against its own digest before it is moved into place. The
//! three largest files are 6 to 8 MB each, which is why they are fetched rather than committed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use crate::{io, python, run, sha256_file, FetchError};

/// One file of the archive and the digest it must have.
#[derive(Debug)]
pub struct Member {
    /// Path inside the archive, below [`Sdist::root`].
    pub path: &'static str,
    pub sha256: &'static str,
}

impl Member {
    /// The name the file has in the cache: the last component of its path.
    pub fn file_name(&self) -> &'static str {
        self.path.rsplit('/').next().unwrap_or(self.path)
    }
}

/// A pinned source distribution and the members taken from it.
#[derive(Debug)]
pub struct Sdist {
    /// The cache subdirectory the members are extracted into.
    pub name: &'static str,
    /// The distribution's name, as pip's `--no-binary` takes it.
    pub package: &'static str,
    pub version: &'static str,
    /// SHA-256 of the downloaded `.tar.gz`.
    pub sha256: &'static str,
    /// The directory every member is under (the sdist's top-level folder and below).
    pub root: &'static str,
    pub members: &'static [Member],
}

/// llama.cpp's tokenizer test vectors and Unicode table, from llama-cpp-python 0.3.36 (MIT).
/// For each vocabulary `ggml-vocab-NAME.gguf` (vocab only, no weights), `.gguf.inp` holds the
/// inputs and `.gguf.out` llama.cpp's ids for them (format: llama.cpp's
/// tests/test-tokenizer-0.cpp).
pub const LLAMA_CPP_TEST_DATA: Sdist = Sdist {
    name: "llama-cpp-python-0.3.36",
    package: "llama-cpp-python",
    version: "0.3.36",
    sha256: "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
    root: "llama_cpp_python-0.3.36/vendor/llama.cpp",
    members: &[
        // 7.8 MB, 1.9 kB, 1.7 kB
        m("models/ggml-vocab-llama-bpe.gguf", "97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e"),
        m("models/ggml-vocab-llama-bpe.gguf.inp", "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0"),
        m("models/ggml-vocab-llama-bpe.gguf.out", "118abf2034a197fc5c9dec5204dfdeee7004c7c70952ae577f66b99e212fab9b"),
        // 5.9 MB each
        m("models/ggml-vocab-qwen2.gguf", "44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c"),
        m("models/ggml-vocab-qwen2.gguf.inp", "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0"),
        m("models/ggml-vocab-qwen2.gguf.out", "de785bb305cc6fa9d43908ed5da337f853c0b79e971348fcfb9f0915a39c5363"),
        m("models/ggml-vocab-qwen35.gguf", "63ed952ff338996cf0bdf24a7b10015124273f75c6dc9bb427356aa3f67ec62c"),
        m("models/ggml-vocab-qwen35.gguf.inp", "0fc6547e7876cd5b2ef64a9d319c6e39040eb53986660bd4227ed7ddef017a94"),
        m("models/ggml-vocab-qwen35.gguf.out", "5efe225820325303857d0a087a8d59216f0d1e9a9e31133e7a5b44c3c4e1e9ca"),
        // 0.7 MB each
        m("models/ggml-vocab-phi-3.gguf", "967d7190d11c4842eab697079d98d56c2116e10eb617be355a2733bfc132e326"),
        m("models/ggml-vocab-phi-3.gguf.inp", "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0"),
        m("models/ggml-vocab-phi-3.gguf.out", "ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29"),
        m("models/ggml-vocab-llama-spm.gguf", "16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69"),
        m("models/ggml-vocab-llama-spm.gguf.inp", "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0"),
        m("models/ggml-vocab-llama-spm.gguf.out", "ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29"),
        // 1.7 MB each: the GPT-2 pattern, and the SmolLM one (llama.cpp runs "starcoder" and
        // "smollm" through the same regexes).
        m("models/ggml-vocab-gpt-2.gguf", "cedc56ca6e2e89f63e781696d1fd76b4b1d49e6720dee86463e915f6e90016ac"),
        m("models/ggml-vocab-gpt-2.gguf.inp", "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0"),
        m("models/ggml-vocab-gpt-2.gguf.out", "48e8c4cb3ad5c37915b225f872222567c1c4dd4d66951aa53460c8d152ff6d60"),
        m("models/ggml-vocab-starcoder.gguf", "fedb892b4e1bd3c1f2fcdae356440b14fb458f4264d586e5c987ed93df4e174d"),
        m("models/ggml-vocab-starcoder.gguf.inp", "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0"),
        m("models/ggml-vocab-starcoder.gguf.out", "3ef12183c57ad076f9defd8e5eb454f509f5f0865cad35646abb4c4b2d2c5764"),
        // 168 kB: the character classes llama.cpp's pre-tokenizers run on.
        m("src/unicode-data.cpp", "95170cd1c105a5b41a1b2dce73b0fae8ce8011ef7897600828bb2babe8b26e5d"),
    ],
};

const fn m(path: &'static str, sha256: &'static str) -> Member {
    Member { path, sha256 }
}

/// The directory holding every member of `sdist`, each verified; fetched when any is missing.
/// Verified once per process. A cached member with another digest is an error, never used.
pub fn ensure_sdist(sdist: &'static Sdist) -> Result<PathBuf, FetchError> {
    static DONE: OnceLock<Mutex<HashMap<&'static str, PathBuf>>> = OnceLock::new();
    let done = DONE.get_or_init(Default::default);
    let mut done = done.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = done.get(sdist.name) {
        return Ok(p.clone());
    }
    let dir = crate::cache_dir().join(sdist.name);
    let mut missing = Vec::new();
    for member in sdist.members {
        let path = dir.join(member.file_name());
        if path.exists() {
            check(&path, member.sha256)?;
        } else {
            missing.push(member);
        }
    }
    if !missing.is_empty() {
        fetch_members(sdist, &missing, &dir, &python())?;
    }
    done.insert(sdist.name, dir.clone());
    Ok(dir)
}

fn check(path: &Path, expected: &str) -> Result<(), FetchError> {
    let actual = sha256_file(path)?;
    if actual != expected {
        return Err(FetchError::Checksum { path: path.display().to_string(), expected: expected.to_string(), actual });
    }
    Ok(())
}

/// Streams the archive once and writes each wanted member to the file name the caller chose, so
/// that no path from inside the archive is ever written to.
const EXTRACT: &str = "import sys, tarfile, shutil, os\n\
                       out, want = sys.argv[2], dict(zip(sys.argv[3::2], sys.argv[4::2]))\n\
                       with tarfile.open(sys.argv[1], 'r|gz') as t:\n    \
                       for m in t:\n        \
                       if m.isfile() and m.name in want:\n            \
                       with t.extractfile(m) as src, open(os.path.join(out, want.pop(m.name)), 'wb') as dst:\n                \
                       shutil.copyfileobj(src, dst, 1 << 20)\n\
                       if want:\n    \
                       sys.exit('not in the archive: ' + ', '.join(sorted(want)))\n";

/// Downloads into a work directory, extracts and verifies there, then renames each member into
/// `dir`: a failed or bad download leaves nothing under a final name.
fn fetch_members(sdist: &Sdist, missing: &[&Member], dir: &Path, python: &str) -> Result<(), FetchError> {
    std::fs::create_dir_all(dir).map_err(io("create", dir))?;
    let work = dir.join(format!(".fetch-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(io("create", &work))?;
    let result = fetch_via(sdist, missing, dir, &work, python);
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn fetch_via(sdist: &Sdist, missing: &[&Member], dir: &Path, work: &Path, python: &str) -> Result<(), FetchError> {
    let requirement = format!("{}=={}", sdist.package, sdist.version);
    eprintln!("fetching {} member(s) of {requirement} (sdist) with pip into {}", missing.len(), dir.display());
    let download = work.join("sdist");
    std::fs::create_dir_all(&download).map_err(io("create", &download))?;
    // `--no-binary` names the one package: pip prepares the sdist's metadata, and `:all:` would
    // make it build the build backend's own dependencies (CMake) from source too.
    let out = run(Command::new(python)
        .args(["-m", "pip", "download", "--no-deps", "--no-cache-dir", "-q", "--no-binary", sdist.package, "-d"])
        .arg(&download)
        .arg(&requirement))?;
    if !out.status.success() {
        return Err(FetchError::Download {
            package: requirement,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let archive = std::fs::read_dir(&download)
        .map_err(io("list", &download))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with(".tar.gz"))
        .ok_or_else(|| FetchError::Download {
            package: requirement.clone(),
            stderr: "pip reported success but left no .tar.gz".into(),
        })?;
    check(&archive, sdist.sha256)?;

    let mut cmd = Command::new(python);
    cmd.arg("-c").arg(EXTRACT).arg(&archive).arg(work);
    for member in missing {
        cmd.arg(format!("{}/{}", sdist.root, member.path)).arg(member.file_name());
    }
    let out = run(&mut cmd)?;
    if !out.status.success() {
        return Err(FetchError::Extract {
            member: missing.iter().map(|m| m.path).collect::<Vec<_>>().join(", "),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    // Every member is verified before any is moved, so a bad archive adds nothing to the cache.
    for member in missing {
        check(&work.join(member.file_name()), member.sha256)?;
    }
    for member in missing {
        let dest = dir.join(member.file_name());
        std::fs::rename(work.join(member.file_name()), &dest).map_err(io("move into place", &dest))?;
    }
    eprintln!("{} member(s) of {requirement} verified", missing.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_have_distinct_file_names_and_well_formed_digests() {
        let names: std::collections::HashSet<_> = LLAMA_CPP_TEST_DATA.members.iter().map(Member::file_name).collect();
        assert_eq!(names.len(), LLAMA_CPP_TEST_DATA.members.len());
        for member in
            LLAMA_CPP_TEST_DATA.members.iter().chain([&Member { path: "x", sha256: LLAMA_CPP_TEST_DATA.sha256 }])
        {
            assert_eq!(member.sha256.len(), 64, "{}", member.path);
            assert!(member.sha256.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()), "{}", member.path);
        }
    }

    #[test]
    fn a_failed_download_is_reported_and_leaves_nothing_behind() {
        let dir = std::env::temp_dir().join(format!("pw-sdist-fail-{}", std::process::id()));
        let missing: Vec<&Member> = LLAMA_CPP_TEST_DATA.members.iter().collect();
        // `false` stands in for a Python whose pip cannot reach the registry.
        let e = fetch_members(&LLAMA_CPP_TEST_DATA, &missing, &dir, "false").unwrap_err();
        assert!(matches!(e, FetchError::Download { .. }), "{e}");
        assert!(e.to_string().contains("llama-cpp-python==0.3.36"), "{e}");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "work directory left behind");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_extraction_writes_only_the_named_members_under_the_given_names() {
        let dir = std::env::temp_dir().join(format!("pw-sdist-extract-{}", std::process::id()));
        let src = dir.join("src");
        std::fs::create_dir_all(src.join("pkg-1/sub")).unwrap();
        std::fs::write(src.join("pkg-1/sub/a.txt"), b"wanted").unwrap();
        std::fs::write(src.join("pkg-1/sub/b.txt"), b"not wanted").unwrap();
        let archive = dir.join("pkg-1.tar.gz");
        let tar = Command::new("tar").arg("czf").arg(&archive).arg("-C").arg(&src).arg("pkg-1").status().unwrap();
        assert!(tar.success());
        let out = dir.join("out");
        std::fs::create_dir_all(&out).unwrap();
        let run = |members: &[&str]| {
            Command::new("python3").arg("-c").arg(EXTRACT).arg(&archive).arg(&out).args(members).output().unwrap()
        };
        let ok = run(&["pkg-1/sub/a.txt", "renamed"]);
        assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
        assert_eq!(std::fs::read(out.join("renamed")).unwrap(), b"wanted");
        assert_eq!(std::fs::read_dir(&out).unwrap().count(), 1);
        let absent = run(&["pkg-1/sub/c.txt", "c"]);
        assert!(!absent.status.success());
        assert!(String::from_utf8_lossy(&absent.stderr).contains("not in the archive: pkg-1/sub/c.txt"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
