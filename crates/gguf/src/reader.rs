use std::collections::HashMap;
use std::ops::Deref;
use std::path::Path;

use crate::{GgmlType, GgufError, Value};

const MAGIC: u32 = 0x4655_4747; // "GGUF" little-endian
const MAX_DIMS: u32 = 4;
const MAX_ARRAY_DEPTH: usize = 4;
const DEFAULT_ALIGNMENT: u64 = 32;
/// The most a collection reserves before its items are read. A count that fits the bytes left
/// is still only a claim, and an item in memory can be many times its encoded size (a `Value`
/// is 32 bytes, a bool on disk 1): reserving for the whole claim would let a file that is then
/// refused cost many times its own size. Beyond this, vectors grow as items are actually read.
const MAX_RESERVE_BYTES: usize = 4096;

/// How many `T`s to reserve for a claimed count of `n`.
fn reserve_for<T>(n: usize) -> usize {
    n.min(MAX_RESERVE_BYTES / std::mem::size_of::<T>().max(1))
}

/// One tensor of the directory. `dims` are in ggml order: `dims[0]` is the fastest-varying
/// (row length); `offset` is relative to the start of the data section.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    pub offset: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// The parsed header of a GGUF file: metadata and tensor directory, with every tensor's data
/// range already checked to lie inside the file.
#[derive(Debug, Clone)]
pub struct Gguf {
    pub version: u32,
    metadata: Vec<(String, Value)>,
    index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    data_offset: usize,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], GgufError> {
        let remaining = self.buf.len() - self.pos;
        if n > remaining {
            return Err(GgufError::Truncated { offset: self.pos, needed: n - remaining, what });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A length that must be satisfiable by the bytes left, `min_each` bytes per item: refusing
    /// impossible counts up front is what keeps a hostile header from reserving gigabytes.
    fn count(&mut self, min_each: usize, what: &'static str) -> Result<usize, GgufError> {
        let at = self.pos;
        let n = self.u64(what)?;
        let need = n.checked_mul(min_each as u64);
        match need {
            Some(need) if need <= self.remaining() as u64 => Ok(n as usize),
            _ => Err(GgufError::Malformed {
                offset: at,
                reason: format!("{what} count {n} cannot fit in the {} bytes left", self.remaining()),
            }),
        }
    }

    fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        let len = self.count(1, what)?;
        let at = self.pos;
        let bytes = self.take(len, what)?;
        // Checked in place, so a string that is refused is never copied.
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| GgufError::Malformed { offset: at, reason: format!("{what} is not valid UTF-8") })
    }

    fn value(&mut self, ty: u32, depth: usize) -> Result<Value, GgufError> {
        const W: &str = "metadata value";
        Ok(match ty {
            0 => Value::U8(self.array::<1>(W)?[0]),
            1 => Value::I8(self.array::<1>(W)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array(W)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(W)?)),
            4 => Value::U32(self.u32(W)?),
            5 => Value::I32(i32::from_le_bytes(self.array(W)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(W)?)),
            7 => {
                let at = self.pos;
                match self.array::<1>(W)?[0] {
                    0 => Value::Bool(false),
                    1 => Value::Bool(true),
                    b => return Err(GgufError::Malformed { offset: at, reason: format!("bool byte {b}") }),
                }
            }
            8 => Value::String(self.string("string value")?),
            9 => {
                let at = self.pos;
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::Malformed { offset: at, reason: "arrays nested too deep".into() });
                }
                let elem = self.u32("array element type")?;
                let n = self.count(min_value_bytes(elem)?, "array")?;
                let mut items = Vec::with_capacity(reserve_for::<Value>(n));
                for _ in 0..n {
                    items.push(self.value(elem, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(W)?),
            11 => Value::I64(i64::from_le_bytes(self.array(W)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(W)?)),
            other => return Err(GgufError::UnknownValueType(other)),
        })
    }
}

fn min_value_bytes(ty: u32) -> Result<usize, GgufError> {
    Ok(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10 | 11 | 12 => 8,
        9 => 12,
        other => return Err(GgufError::UnknownValueType(other)),
    })
}

impl Gguf {
    /// Parses the header of a whole file held in memory.
    pub fn parse(buf: &[u8]) -> Result<Gguf, GgufError> {
        let mut c = Cursor { buf, pos: 0 };
        let magic = c.u32("magic")?;
        if magic != MAGIC {
            return Err(GgufError::BadMagic { found: magic });
        }
        let version = c.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion(version));
        }
        // A tensor entry takes at least 8 (name) + 4 (n_dims) + 4 (type) + 8 (offset) bytes, a
        // metadata entry at least 8 (key) + 4 (type) + 1.
        let n_tensors = c.count(24, "tensor")?;
        let n_kv = c.count(13, "metadata")?;

        let mut metadata = Vec::with_capacity(reserve_for::<(String, Value)>(n_kv));
        // A hash map's table takes about twice its entries' size.
        let mut index = HashMap::with_capacity(reserve_for::<(String, usize)>(n_kv) / 2);
        for _ in 0..n_kv {
            let at = c.pos;
            let key = c.string("metadata key")?;
            let ty = c.u32("metadata type")?;
            let value = c.value(ty, 0)?;
            if index.insert(key.clone(), metadata.len()).is_some() {
                return Err(GgufError::Malformed { offset: at, reason: format!("duplicate key {key}") });
            }
            metadata.push((key, value));
        }

        let mut infos = Vec::with_capacity(reserve_for::<TensorInfo>(n_tensors));
        for _ in 0..n_tensors {
            let at = c.pos;
            let name = c.string("tensor name")?;
            let n_dims = c.u32("tensor n_dims")?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(GgufError::Malformed { offset: at, reason: format!("tensor {name}: {n_dims} dims") });
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(c.u64("tensor dim")?);
            }
            let ty_id = c.u32("tensor type")?;
            let offset = c.u64("tensor offset")?;
            let ty = GgmlType::from_id(ty_id)
                .ok_or_else(|| GgufError::UnsupportedTensorType { name: name.clone(), ty: ty_id })?;
            let n_elems = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
            let n_bytes = n_elems.filter(|_| dims[0] % ty.block().0 as u64 == 0).and_then(|n| ty.bytes_for(n));
            let n_bytes = n_bytes.ok_or_else(|| GgufError::Malformed {
                offset: at,
                reason: format!("tensor {name}: shape {dims:?} is not a whole number of {} blocks", ty.name()),
            })?;
            infos.push(TensorInfo { name, dims, ty, offset, n_bytes });
        }

        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            Some((_, v)) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 16 => a,
                _ => return Err(GgufError::Malformed { offset: c.pos, reason: "bad general.alignment".into() }),
            },
            None => DEFAULT_ALIGNMENT,
        };
        let data_offset = (c.pos as u64).div_ceil(alignment) * alignment;
        let mut tensor_index = HashMap::with_capacity(infos.len());
        for (i, t) in infos.iter().enumerate() {
            let start = data_offset.checked_add(t.offset);
            let end = start.and_then(|s| s.checked_add(t.n_bytes));
            match (start, end) {
                (Some(s), Some(e)) if e <= buf.len() as u64 && t.offset % alignment == 0 => {
                    let _ = s;
                }
                _ => {
                    return Err(GgufError::TensorOutOfBounds {
                        name: t.name.clone(),
                        start: start.unwrap_or(u64::MAX),
                        end: end.unwrap_or(u64::MAX),
                        len: buf.len(),
                    })
                }
            }
            if tensor_index.insert(t.name.clone(), i).is_some() {
                return Err(GgufError::Malformed { offset: 0, reason: format!("duplicate tensor {}", t.name) });
            }
        }
        Ok(Gguf { version, metadata, index, tensors: infos, tensor_index, data_offset: data_offset as usize })
    }

    pub fn metadata(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.metadata.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    fn wrong(key: &str, v: &Value, expected: &'static str) -> GgufError {
        GgufError::WrongType { key: key.to_string(), found: v.type_name(), expected }
    }

    pub fn u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.require(key)?;
        v.as_u64().ok_or_else(|| Self::wrong(key, v, "unsigned integer"))
    }

    pub fn f32(&self, key: &str) -> Result<f32, GgufError> {
        let v = self.require(key)?;
        v.as_f64().map(|f| f as f32).ok_or_else(|| Self::wrong(key, v, "float"))
    }

    pub fn str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| Self::wrong(key, v, "string"))
    }

    pub fn bool(&self, key: &str) -> Result<bool, GgufError> {
        let v = self.require(key)?;
        v.as_bool().ok_or_else(|| Self::wrong(key, v, "bool"))
    }

    pub fn str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        let v = self.require(key)?;
        let arr = v.as_array().ok_or_else(|| Self::wrong(key, v, "array of strings"))?;
        arr.iter().map(|e| e.as_str().ok_or_else(|| Self::wrong(key, e, "string"))).collect()
    }

    pub fn i64_array(&self, key: &str) -> Result<Vec<i64>, GgufError> {
        let v = self.require(key)?;
        let arr = v.as_array().ok_or_else(|| Self::wrong(key, v, "array of integers"))?;
        arr.iter().map(|e| e.as_i64().ok_or_else(|| Self::wrong(key, e, "integer"))).collect()
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i]).ok_or_else(|| GgufError::MissingTensor(name.to_string()))
    }

    /// The bytes of a tensor within `file` (the buffer this header was parsed from).
    pub fn tensor_data<'f>(&self, file: &'f [u8], name: &str) -> Result<(&TensorInfo, &'f [u8]), GgufError> {
        let t = self.tensor(name)?;
        let start = self.data_offset + t.offset as usize;
        let end = start + t.n_bytes as usize;
        let bytes = file.get(start..end).ok_or_else(|| GgufError::TensorOutOfBounds {
            name: name.to_string(),
            start: start as u64,
            end: end as u64,
            len: file.len(),
        })?;
        Ok((t, bytes))
    }
}

/// Where a file's bytes live: read into memory here, or mapped by a crate that may map files
/// (this one forbids `unsafe`; `model::mapped` maps model files).
pub trait FileBytes: Send + Sync {
    fn bytes(&self) -> &[u8];

    /// Says that `range` will not be read again, so the memory holding it may go. A mapping
    /// drops those pages (read again, they come back from the file); bytes read into memory
    /// stay. The bytes stay valid either way.
    fn release(&self, _range: std::ops::Range<usize>) {}
}

impl FileBytes for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// A GGUF file's bytes with its parsed header.
pub struct GgufFile {
    bytes: Box<dyn FileBytes>,
    header: Gguf,
}

impl GgufFile {
    /// Reads the whole file into memory (model files are mapped by `model::mapped` instead).
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let bytes = std::fs::read(path).map_err(|source| GgufError::Io { path: path.display().to_string(), source })?;
        Self::from_bytes(bytes)
    }

    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::from_source(Box::new(bytes))
    }

    pub fn from_source(bytes: Box<dyn FileBytes>) -> Result<GgufFile, GgufError> {
        let header = Gguf::parse(bytes.bytes())?;
        Ok(GgufFile { bytes, header })
    }

    pub fn data(&self, name: &str) -> Result<(&TensorInfo, &[u8]), GgufError> {
        self.header.tensor_data(self.bytes.bytes(), name)
    }

    /// Lets the memory holding tensor `name`'s bytes go (see [`FileBytes::release`]): a loader
    /// that has converted a tensor calls it so the file's pages do not stay beside the copy.
    pub fn release(&self, name: &str) {
        if let Ok(t) = self.tensor(name) {
            let start = (self.data_offset as u64).saturating_add(t.offset);
            let end = start.saturating_add(t.n_bytes).min(self.bytes.bytes().len() as u64);
            if start < end {
                self.bytes.release(start as usize..end as usize);
            }
        }
    }

    pub fn bytes(&self) -> &[u8] {
        self.bytes.bytes()
    }
}

impl Deref for GgufFile {
    type Target = Gguf;
    fn deref(&self) -> &Gguf {
        &self.header
    }
}
