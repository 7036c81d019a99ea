//! Which symbols an ELF shared library defines: its `.dynsym` (what the dynamic linker and a
//! uprobe by symbol name resolve) and `.symtab` where it was not stripped — the tables aya
//! looks a uprobe's symbol up in. Only the section headers and the symbol and string tables
//! are read (a driver library is tens of MiB), with positioned reads.

use std::collections::BTreeSet;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use anyhow::{Context, Result, bail};

const SHT_SYMTAB: u32 = 2;
const SHT_DYNSYM: u32 = 11;
const SHN_UNDEF: u16 = 0;
const SHDR_SIZE: usize = 64;
const SYM_SIZE: usize = 24;
/// No string or symbol table of a real library comes near this; a corrupt header might.
const MAX_TABLE: u64 = 256 << 20;

/// The names among `wanted` that `path` defines (not merely imports).
pub fn defined<'a>(path: &Path, wanted: &[&'a str]) -> Result<Vec<&'a str>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let names = defined_names(&file).with_context(|| format!("reading {}", path.display()))?;
    Ok(wanted
        .iter()
        .copied()
        .filter(|w| names.contains(w.as_bytes()))
        .collect())
}

fn defined_names(file: &File) -> Result<BTreeSet<Vec<u8>>> {
    let mut ehdr = [0u8; 64];
    file.read_exact_at(&mut ehdr, 0)
        .context("too short for an ELF header")?;
    if ehdr[..4] != *b"\x7fELF" {
        bail!("not an ELF file");
    }
    if ehdr[4] != 2 || ehdr[5] != 1 {
        bail!("not a 64-bit little-endian ELF file");
    }
    let shoff = u64_at(&ehdr, 0x28);
    let shentsize = usize::from(u16_at(&ehdr, 0x3a));
    let shnum = usize::from(u16_at(&ehdr, 0x3c));
    if shnum == 0 || shentsize < SHDR_SIZE {
        bail!("no section headers");
    }
    let mut shdrs = vec![0u8; shnum * shentsize];
    file.read_exact_at(&mut shdrs, shoff)
        .context("section headers cut short")?;
    let section = |i: usize| &shdrs[i * shentsize..i * shentsize + SHDR_SIZE];
    let mut names = BTreeSet::new();
    for i in 0..shnum {
        let sh = section(i);
        let kind = u32_at(sh, 4);
        if kind != SHT_DYNSYM && kind != SHT_SYMTAB {
            continue;
        }
        let link = u32_at(sh, 40) as usize;
        if link >= shnum {
            bail!("symbol table {i} links to section {link}, which does not exist");
        }
        let syms = read_table(file, sh)?;
        let strtab = read_table(file, section(link))?;
        for sym in syms.chunks_exact(SYM_SIZE) {
            let name_at = u32_at(sym, 0) as usize;
            if u16_at(sym, 6) == SHN_UNDEF || name_at == 0 || name_at >= strtab.len() {
                continue;
            }
            let rest = &strtab[name_at..];
            let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
            names.insert(rest[..end].to_vec());
        }
    }
    Ok(names)
}

fn read_table(file: &File, sh: &[u8]) -> Result<Vec<u8>> {
    let (offset, size) = (u64_at(sh, 24), u64_at(sh, 32));
    if size > MAX_TABLE {
        bail!("a table of {size} bytes: not a library this check reads");
    }
    let mut buf = vec![0u8; size as usize];
    file.read_exact_at(&mut buf, offset)
        .context("a symbol or string table cut short")?;
    Ok(buf)
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
pub mod tests {
    use super::*;

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
