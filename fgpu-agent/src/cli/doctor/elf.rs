//! Which symbols an ELF shared library defines: its `.dynsym` (what the dynamic linker and a
//! uprobe by symbol name resolve) and `.symtab` where it was not stripped — the tables aya
//! looks a uprobe's symbol up in. Read with the `object` crate (the ELF reader aya itself
//! uses) through a read cache: only the headers and the symbol and string tables are read
//! from disk (a driver library is tens of MiB).

use std::collections::BTreeSet;
use std::fs::File;
use std::path::Path;

use anyhow::{Context, Result, bail};
use object::read::{Object, ObjectSymbol, ReadCache};

/// The names among `wanted` that `path` defines (not merely imports).
pub fn defined<'a>(path: &Path, wanted: &[&'a str]) -> Result<Vec<&'a str>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let names = defined_names(file).with_context(|| format!("reading {}", path.display()))?;
    Ok(wanted
        .iter()
        .copied()
        .filter(|w| names.contains(w.as_bytes()))
        .collect())
}

fn defined_names(file: File) -> Result<BTreeSet<Vec<u8>>> {
    let cache = ReadCache::new(file);
    let mut magic = [0u8; 4];
    match object::ReadRef::read_bytes_at(&cache, 0, 4) {
        Ok(b) => magic.copy_from_slice(b),
        Err(()) => bail!("too short for an ELF header"),
    }
    if magic != *b"\x7fELF" {
        bail!("not an ELF file");
    }
    let obj =
        object::File::parse(&cache).map_err(|e| anyhow::anyhow!("not a readable ELF file: {e}"))?;
    let mut names = BTreeSet::new();
    for sym in obj.symbols().chain(obj.dynamic_symbols()) {
        if sym.is_undefined() {
            continue;
        }
        if let Ok(name) = sym.name_bytes()
            && !name.is_empty()
        {
            names.insert(name.to_vec());
        }
    }
    Ok(names)
}

#[cfg(test)]
pub mod tests {
    use super::*;

    const SHT_DYNSYM: u32 = 11;
    const SHN_UNDEF: u16 = 0;
    const SHDR_SIZE: usize = 64;
    const SYM_SIZE: usize = 24;

    /// A minimal ELF64 shared object whose `.dynsym` defines `defined` and imports
    /// `imported` (section index 0), for tests of the checks that read symbols.
    pub fn tiny_so(defined: &[&str], imported: &[&str]) -> Vec<u8> {
        let mut strtab = vec![0u8];
        let mut syms = vec![0u8; SYM_SIZE]; // the null symbol
        for (names, shndx) in [(defined, 1u16), (imported, SHN_UNDEF)] {
            for name in names {
                let at = strtab.len() as u32;
                strtab.extend_from_slice(name.as_bytes());
                strtab.push(0);
                let mut sym = [0u8; SYM_SIZE];
                sym[0..4].copy_from_slice(&at.to_le_bytes());
                sym[4] = 0x12; // global function
                sym[6..8].copy_from_slice(&shndx.to_le_bytes());
                syms.extend_from_slice(&sym);
            }
        }
        let syms_at = 64u64;
        let str_at = syms_at + syms.len() as u64;
        let shoff = str_at + strtab.len() as u64;
        let mut out = vec![0u8; 64];
        out[..4].copy_from_slice(b"\x7fELF");
        out[4] = 2;
        out[5] = 1;
        out[6] = 1;
        out[0x10] = 3; // ET_DYN
        out[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
        out[0x3a..0x3c].copy_from_slice(&(SHDR_SIZE as u16).to_le_bytes());
        out[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        out[0x3e..0x40].copy_from_slice(&2u16.to_le_bytes()); // section names: the string table
        out.extend_from_slice(&syms);
        out.extend_from_slice(&strtab);
        let shdr = |kind: u32, offset: u64, size: u64, link: u32| {
            let mut sh = [0u8; SHDR_SIZE];
            sh[4..8].copy_from_slice(&kind.to_le_bytes());
            sh[24..32].copy_from_slice(&offset.to_le_bytes());
            sh[32..40].copy_from_slice(&size.to_le_bytes());
            sh[40..44].copy_from_slice(&link.to_le_bytes());
            sh
        };
        out.extend_from_slice(&[0u8; SHDR_SIZE]);
        out.extend_from_slice(&shdr(SHT_DYNSYM, syms_at, syms.len() as u64, 2));
        out.extend_from_slice(&shdr(3, str_at, strtab.len() as u64, 0));
        out
    }

    #[test]
    fn defined_symbols_are_found_and_imports_are_not() {
        let dir = std::env::temp_dir().join(format!("fgpu-doctor-elf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lib = dir.join("libcuda.so.1");
        std::fs::write(
            &lib,
            tiny_so(&["cuMemAlloc_v2", "cuInit"], &["cuMemFree_v2"]),
        )
        .unwrap();
        let found = defined(&lib, &["cuMemAlloc_v2", "cuMemFree_v2", "cuMemCreate"]).unwrap();
        assert_eq!(found, ["cuMemAlloc_v2"]);

        let text = dir.join("notes.txt");
        std::fs::write(&text, vec![b'x'; 100]).unwrap();
        let err = format!("{:#}", defined(&text, &["cuInit"]).unwrap_err());
        assert!(err.ends_with("not an ELF file"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn this_test_binary_defines_its_own_exports() {
        // A real ELF file from the toolchain: the test binary itself (not stripped).
        let exe = std::env::current_exe().unwrap();
        let found = defined(&exe, &["main", "fgpu_no_such_symbol"]).unwrap();
        assert_eq!(found, ["main"]);
    }
}
