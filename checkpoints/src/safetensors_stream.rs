//! Writing a safetensors file one tensor at a time, so a model larger than RAM can be saved group by
//! group. The header (every name, dtype, shape and offset) is known up front and written first; then
//! each tensor's bytes in the declared order. The file is fsynced before [`StreamWriter::finish`]
//! returns, which also gives the file's size and CRC32 for the checkpoint's manifest.
//!
//! The layout is the one the `safetensors` crate reads: an 8-byte little-endian header length, a JSON
//! header padded with spaces to a multiple of 8, then the tensors' bytes back to back.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use safetensors::Dtype;

/// One tensor the file will hold.
#[derive(Clone, Debug)]
pub struct TensorEntry {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
}

impl TensorEntry {
    pub fn new(name: impl Into<String>, dtype: Dtype, shape: Vec<usize>) -> Self {
        TensorEntry { name: name.into(), dtype, shape }
    }
    pub fn len_bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.bitsize() / 8
    }
}

/// What a finished file is: its size and checksum, for the manifest that lets a reader detect a
/// truncated or bit-flipped file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileDigest {
    pub bytes: u64,
    pub crc32: u32,
}

/// A safetensors file being written tensor by tensor.
pub struct StreamWriter {
    path: PathBuf,
    out: BufWriter<File>,
    entries: Vec<TensorEntry>,
    next: usize,
    crc: crc32fast::Hasher,
    bytes: u64,
}

fn dtype_name(dtype: Dtype) -> Result<&'static str> {
    Ok(match dtype {
        Dtype::F32 => "F32",
        Dtype::F16 => "F16",
        Dtype::BF16 => "BF16",
        Dtype::F64 => "F64",
        Dtype::U8 => "U8",
        Dtype::I64 => "I64",
        other => bail!("dtype {other:?} is not one zerostream writes"),
    })
}

impl StreamWriter {
    /// Creates `path` (which must not exist: checkpoint files are written into a fresh directory) and
    /// writes the header for `entries`, which must then be written in this order.
    pub fn create(path: &Path, entries: Vec<TensorEntry>, metadata: &BTreeMap<String, String>) -> Result<Self> {
        let mut header = serde_json::Map::new();
        if !metadata.is_empty() {
            header.insert("__metadata__".into(), serde_json::to_value(metadata)?);
        }
        let mut offset = 0usize;
        for e in &entries {
            let end = offset + e.len_bytes();
            header.insert(
                e.name.clone(),
                serde_json::json!({ "dtype": dtype_name(e.dtype)?, "shape": e.shape, "data_offsets": [offset, end] }),
            );
            offset = end;
        }
        let mut text = serde_json::to_string(&header)?.into_bytes();
        // The data must start 8-byte aligned; safetensors pads the header with spaces.
        text.resize(text.len().next_multiple_of(8), b' ');
        let file = File::options().write(true).create_new(true).open(path).with_context(|| format!("creating {}", path.display()))?;
        let mut w = StreamWriter {
            path: path.to_path_buf(),
            out: BufWriter::with_capacity(1 << 20, file),
            entries,
            next: 0,
            crc: crc32fast::Hasher::new(),
            bytes: 0,
        };
        w.put(&(text.len() as u64).to_le_bytes())?;
        w.put(&text)?;
        Ok(w)
    }

    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes).with_context(|| format!("writing {}", self.path.display()))?;
        self.crc.update(bytes);
        self.bytes += bytes.len() as u64;
        Ok(())
    }

    /// The next tensor's bytes (little-endian, as the header declared it).
    pub fn write_tensor(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        let Some(e) = self.entries.get(self.next) else {
            bail!("{}: tensor {name} written after the last declared tensor", self.path.display());
        };
        if e.name != name || e.len_bytes() != bytes.len() {
            bail!("{}: expected tensor {} ({} bytes) next, got {name} ({} bytes)", self.path.display(), e.name, e.len_bytes(), bytes.len());
        }
        self.next += 1;
        self.put(bytes)
    }

    /// The next tensor, given as f32 values and converted to its declared dtype (f32, bf16, f16).
    pub fn write_f32(&mut self, name: &str, values: &[f32]) -> Result<()> {
        let dtype = self.entries.get(self.next).map(|e| e.dtype);
        match dtype {
            Some(Dtype::BF16) => {
                let words: Vec<u16> = values.iter().map(|&x| half::bf16::from_f32(x).to_bits()).collect();
                self.write_tensor(name, bytemuck::cast_slice(&words))
            }
            Some(Dtype::F16) => {
                let words: Vec<u16> = values.iter().map(|&x| half::f16::from_f32(x).to_bits()).collect();
                self.write_tensor(name, bytemuck::cast_slice(&words))
            }
            _ => self.write_tensor(name, bytemuck::cast_slice(values)),
        }
    }

    /// Checks every declared tensor was written, flushes and fsyncs.
    pub fn finish(mut self) -> Result<FileDigest> {
        if self.next != self.entries.len() {
            bail!("{}: only {} of {} tensors were written", self.path.display(), self.next, self.entries.len());
        }
        self.out.flush().with_context(|| format!("writing {}", self.path.display()))?;
        let file = self.out.into_inner().map_err(|e| e.into_error()).with_context(|| format!("writing {}", self.path.display()))?;
        crate::os::sync_file(&file).with_context(|| format!("syncing {}", self.path.display()))?;
        Ok(FileDigest { bytes: self.bytes, crc32: self.crc.finalize() })
    }
}

/// Size and CRC32 of a file, read in 1 MiB pieces.
pub fn digest_file(path: &Path) -> Result<FileDigest> {
    use std::io::Read;
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut crc = crc32fast::Hasher::new();
    let mut bytes = 0u64;
    loop {
        let n = file.read(&mut buf).with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        crc.update(&buf[..n]);
        bytes += n as u64;
    }
    Ok(FileDigest { bytes, crc32: crc.finalize() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_files_read_back_with_the_safetensors_crate() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.safetensors");
        let entries = vec![
            TensorEntry::new("b", Dtype::F32, vec![3]),
            TensorEntry::new("a", Dtype::BF16, vec![2, 2]),
            TensorEntry::new("c", Dtype::F16, vec![1]),
        ];
        let meta = BTreeMap::from([("world_size".to_string(), "2".to_string())]);
        let mut w = StreamWriter::create(&path, entries, &meta).unwrap();
        assert!(w.write_f32("a", &[1.0; 4]).is_err(), "out of order is refused");
        w.write_f32("b", &[1.0, 2.0, 3.5]).unwrap();
        w.write_f32("a", &[0.5, 1.0, 1.5, 2.0]).unwrap();
        w.write_f32("c", &[0.25]).unwrap();
        let digest = w.finish().unwrap();
        assert_eq!(digest, digest_file(&path).unwrap());
        let bytes = std::fs::read(&path).unwrap();
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        assert_eq!(meta.metadata().as_ref().unwrap()["world_size"], "2");
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(crate::hf::to_f32(Dtype::F32, st.tensor("b").unwrap().data()).unwrap(), vec![1.0, 2.0, 3.5]);
        assert_eq!(crate::hf::to_f32(Dtype::BF16, st.tensor("a").unwrap().data()).unwrap(), vec![0.5, 1.0, 1.5, 2.0]);
        assert_eq!(st.tensor("a").unwrap().shape(), &[2, 2]);
        assert_eq!(crate::hf::to_f32(Dtype::F16, st.tensor("c").unwrap().data()).unwrap(), vec![0.25]);
        // A file that already exists is never overwritten.
        assert!(StreamWriter::create(&path, vec![], &BTreeMap::new()).is_err());
    }

    #[test]
    fn unfinished_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let w = StreamWriter::create(&dir.path().join("y"), vec![TensorEntry::new("a", Dtype::F32, vec![1])], &BTreeMap::new()).unwrap();
        let err = w.finish().unwrap_err().to_string();
        assert!(err.contains("only 0 of 1"), "{err}");
    }
}
