//! Model files mapped read-only instead of read into memory.
//!
//! Reading a file into a buffer holds a second copy of every weight beside the repacked one
//! until loading ends (peak memory about twice the file). Mapped, a page of the file is
//! resident only from the first read of its tensor until the loader, having repacked that
//! tensor, releases it ([`gguf::GgufFile::release`] drops the pages from this process; they
//! stay in the page cache for the next start), so peak memory is the repacked weights plus
//! the tensors being repacked. As with llama.cpp's mapping, a file truncated by someone else
//! while it is mapped makes reads past the new end fault (SIGBUS): model files are the
//! operator's, and the loader reads each byte once.

use std::path::Path;

use gguf::{FileBytes, GgufError, GgufFile};

/// A whole file mapped private and read-only.
pub struct MappedFile {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the mapping is read-only and lives until Drop; `release` only drops pages, which
// reads fault back in from the file.
unsafe impl Send for MappedFile {}
// SAFETY: as above.
unsafe impl Sync for MappedFile {}

impl MappedFile {
    #[cfg(unix)]
    fn map(file: &std::fs::File, len: usize) -> std::io::Result<MappedFile> {
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh private read-only mapping of an open file; nothing else refers to it.
        let p =
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, file.as_raw_fd(), 0) };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(MappedFile { ptr: p as *const u8, len })
    }
}

#[cfg(unix)]
impl FileBytes for MappedFile {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` readable bytes until Drop.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn release(&self, range: std::ops::Range<usize>) {
        // Only whole pages inside the range: its neighbours may still be read.
        let page = page_size();
        let (start, end) = (range.start.next_multiple_of(page), range.end.min(self.len) / page * page);
        if start < end {
            // SAFETY: `start..end` lies inside the mapping; dropping pages of a private
            // read-only file mapping loses nothing (never written), and a later read faults
            // the file's bytes back in, so every slice handed out stays valid and unchanged.
            unsafe { libc::madvise(self.ptr.add(start) as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
        }
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        #[cfg(unix)]
        // SAFETY: the mapping made in `map`; slices borrow `self`, so none is left.
        unsafe {
            libc::munmap(self.ptr as *mut libc::c_void, self.len);
        }
    }
}

#[cfg(unix)]
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n.is_power_of_two()).unwrap_or(4096)
}

/// Opens a GGUF file mapped (read into memory where it cannot be mapped: an empty file, a
/// system without mappings).
pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
    open_file(path).map(|(gguf, _)| gguf)
}

/// As [`open`], also handing back the open file: whatever else reads the model (a node's
/// pairing digest, taken while the weights load) then reads the bytes the weights come from,
/// even if the path is replaced meanwhile. Its read position is unspecified.
pub fn open_file(path: &Path) -> Result<(GgufFile, std::fs::File), GgufError> {
    let io = |source| GgufError::Io { path: path.display().to_string(), source };
    let file = std::fs::File::open(path).map_err(io)?;
    let len = usize::try_from(file.metadata().map_err(io)?.len()).unwrap_or(usize::MAX);
    #[cfg(unix)]
    if len > 0 {
        return Ok((GgufFile::from_source(Box::new(MappedFile::map(&file, len).map_err(io)?))?, file));
    }
    let mut bytes = Vec::with_capacity(len.min(1 << 30));
    std::io::Read::read_to_end(&mut &file, &mut bytes).map_err(io)?;
    Ok((GgufFile::from_bytes(bytes)?, file))
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn a_mapped_file_reads_as_the_file_and_released_pages_read_back_unchanged() {
        let dir = std::env::temp_dir().join(format!("pw-mapped-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f.bin");
        let data: Vec<u8> = (0..5 * 4096 + 123u32).map(|i| (i * 31 % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let m = MappedFile::map(&file, data.len()).unwrap();
        assert_eq!(m.bytes(), &data[..]);
        m.release(100..4 * 4096 + 7);
        m.release(0..data.len());
        assert_eq!(m.bytes(), &data[..], "released pages come back from the file");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Resident bytes of the mapping that starts at `addr`, from /proc/self/smaps.
    fn resident(addr: usize) -> Option<usize> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((start, _)) = crate::region::mapping_range(line) {
                inside = start == addr;
            } else if let Some(kb) = line.strip_prefix("Rss:").filter(|_| inside) {
                return kb.trim().trim_end_matches("kB").trim().parse::<usize>().ok().map(|k| k * 1024);
            }
        }
        None
    }

    #[test]
    fn a_released_range_stops_counting_as_resident_memory() {
        let dir = std::env::temp_dir().join(format!("pw-mapped-rss-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f.bin");
        let page = page_size();
        std::fs::write(&path, vec![7u8; 64 * page]).unwrap();
        let m = MappedFile::map(&std::fs::File::open(&path).unwrap(), 64 * page).unwrap();
        let sum: u64 = m.bytes().iter().step_by(page).map(|&b| b as u64).sum();
        assert_eq!(sum, 7 * 64);
        assert_eq!(resident(m.ptr as usize), Some(64 * page), "every page was read");
        // A range that starts and ends inside pages releases only the whole pages within.
        m.release(page / 2..32 * page + 1);
        assert_eq!(resident(m.ptr as usize), Some(33 * page));
        m.release(0..64 * page);
        assert_eq!(resident(m.ptr as usize), Some(0));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
