//! PTX on disk, keyed by what determines it: the translation unit's text, the GPU architecture, the
//! compile options and the NVRTC version. A warm start reads files instead of compiling (NVRTC takes
//! ~100 ms or more per file; reading is well under a millisecond).

use std::path::{Path, PathBuf};

use super::{KernelCompileError, KernelFile, compile, compile_options, translation_unit};

/// Whether a lookup found the PTX on disk or compiled it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheOutcome {
    Hit,
    Compiled,
}

/// A folder of `<file>-<key>.ptx` files. `None` compiles every time (no folder could be used).
#[derive(Clone, Debug)]
pub struct KernelCache {
    dir: Option<PathBuf>,
}

/// `$ESPER_KERNEL_CACHE`, else `$XDG_CACHE_HOME/esper-ecs/kernels`, else `~/.cache/esper-ecs/kernels`.
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("ESPER_KERNEL_CACHE") {
        return Some(PathBuf::from(dir));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))?;
    Some(base.join("esper-ecs").join("kernels"))
}

/// 64-bit FNV-1a over the parts, each followed by a 0 byte so `("ab", "c")` and `("a", "bc")` differ.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for part in parts {
        for &byte in part.iter().chain(&[0u8]) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
}

/// The NVRTC version as `major.minor`, part of the key: another compiler may emit other PTX.
fn nvrtc_version() -> String {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvrtcVersion writes two ints through the pointers it is given and nothing else.
    let result = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if result == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        format!("{major}.{minor}")
    } else {
        "unknown".to_string()
    }
}

/// The cache key of `file` compiled for `arch` with this build's options and NVRTC.
pub fn cache_key(file: &KernelFile, arch: &'static str) -> u64 {
    // Every field of the options (arch, fmad, flags) in one string.
    let options = format!("{:?}", compile_options(arch));
    fnv1a(&[translation_unit(file).as_bytes(), options.as_bytes(), nvrtc_version().as_bytes()])
}

impl KernelCache {
    pub fn new(dir: Option<PathBuf>) -> Self {
        Self { dir }
    }

    /// The cache in [`default_cache_dir`].
    pub fn default_location() -> Self {
        Self::new(default_cache_dir())
    }

    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    fn path(&self, file: &KernelFile, arch: &'static str) -> Option<PathBuf> {
        let stem = file.name.trim_end_matches(".cu");
        self.dir.as_ref().map(|dir| dir.join(format!("{stem}-{arch}-{:016x}.ptx", cache_key(file, arch))))
    }

    /// `file`'s PTX text for `arch`: read from the cache, or compiled and then stored. A cache folder
    /// that cannot be written only costs the next start a compile; it is never an error.
    pub fn ptx(
        &self,
        file: &KernelFile,
        arch: &'static str,
    ) -> Result<(String, CacheOutcome), KernelCompileError> {
        let path = self.path(file, arch);
        if let Some(text) = path.as_ref().and_then(|p| std::fs::read_to_string(p).ok()) {
            return Ok((text, CacheOutcome::Hit));
        }
        let text = compile(file, arch)?.to_src();
        if let Some(path) = path {
            store(&path, &text);
        }
        Ok((text, CacheOutcome::Compiled))
    }
}

/// Writes through a temporary name and renames, so a concurrent reader never sees half a file.
fn store(path: &Path, text: &str) {
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = path.with_extension(format!("ptx.{}.tmp", std::process::id()));
    if std::fs::write(&tmp, text).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}
