//! Loaded ELF images, found with `dl_iterate_phdr`: address ranges, unwind
//! tables (`.eh_frame_hdr` / `.eh_frame`) and GNU build-ids, all read from
//! memory, never from disk.
//!
//! The main executable and the vDSO can never be unloaded, so their tables
//! are borrowed for the life of the process. Shared libraries can be
//! `dlclose`d at any moment by another thread; their tables are copied, so an
//! unwind racing with an unload reads stale but valid bytes instead of
//! unmapped memory.

use std::ffi::CStr;
use std::ops::Deref;

/// Bytes of an image, borrowed when the image is permanent, copied otherwise.
#[derive(Debug, Clone)]
pub(crate) enum ImageBytes {
    /// Memory of an image that is never unloaded.
    Static(&'static [u8]),
    /// A private copy.
    Owned(std::sync::Arc<[u8]>),
}

impl Default for ImageBytes {
    fn default() -> Self {
        Self::Static(&[])
    }
}

impl Deref for ImageBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Self::Static(s) => s,
            Self::Owned(v) => v,
        }
    }
}

/// A section of an image: its address as stated in the file (SVMA) and bytes.
#[derive(Debug, Clone)]
pub(crate) struct Section {
    /// Address in the file's address space.
    pub(crate) svma: u64,
    /// Content.
    pub(crate) bytes: ImageBytes,
}

/// One loaded ELF image.
#[derive(Debug, Clone)]
pub(crate) struct LoadedImage {
    /// File path (`/proc/self/exe` resolved for the main executable).
    pub(crate) path: String,
    /// Load bias: runtime address = file address + `bias`.
    pub(crate) bias: u64,
    /// Runtime address range covered by the image's `PT_LOAD` segments.
    pub(crate) start: u64,
    /// End of that range (exclusive).
    pub(crate) end: u64,
    /// Lowest `p_vaddr` of the `PT_LOAD` segments (Sentry's `image_vmaddr`).
    pub(crate) vmaddr: u64,
    /// `.eh_frame_hdr`, when present.
    pub(crate) eh_frame_hdr: Option<Section>,
    /// `.eh_frame`, from its start to the end of its segment.
    pub(crate) eh_frame: Option<Section>,
    /// The executable segment, for the main executable only.
    pub(crate) text: Option<Section>,
    /// Runtime ranges of the executable segments: where a return address
    /// may point.
    pub(crate) code: Vec<(u64, u64)>,
    /// GNU build-id note content.
    pub(crate) build_id: Option<Vec<u8>>,
}

/// glibc's `dl_phdr_info` including the load counters (present since 2.4;
/// the `size` argument tells whether they are there).
#[repr(C)]
struct DlPhdrInfo {
    addr: usize,
    name: *const libc::c_char,
    phdr: *const Phdr,
    phnum: u16,
    adds: u64,
    subs: u64,
}

#[cfg(target_pointer_width = "64")]
type Phdr = libc::Elf64_Phdr;

const PT_LOAD: u32 = 1;
const PT_NOTE: u32 = 4;
const PT_GNU_EH_FRAME: u32 = 0x6474_e550;
const PF_X: u32 = 1;
const NT_GNU_BUILD_ID: u32 = 3;

/// A counter that changes whenever a library is loaded or unloaded.
pub(crate) fn image_generation() -> u64 {
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        size: usize,
        data: *mut libc::c_void,
    ) -> i32 {
        if size >= std::mem::size_of::<DlPhdrInfo>() {
            // SAFETY: the loader passes a valid info of `size` bytes, large
            // enough for our layout; `data` is the `u64` passed below.
            unsafe {
                let info = &*(info as *const DlPhdrInfo);
                *(data as *mut u64) = info.adds.wrapping_add(info.subs << 32);
            }
        }
        1
    }
    let mut out = 0u64;
    // SAFETY: the callback only reads the info it is given and writes `out`.
    unsafe { libc::dl_iterate_phdr(Some(first), (&raw mut out).cast()) };
    out
}

/// Every image currently loaded.
pub(crate) fn loaded_images() -> Vec<LoadedImage> {
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut libc::c_void,
    ) -> i32 {
        // SAFETY: `data` is the Vec passed below; `info` is valid for the
        // duration of the callback and describes a loaded image, whose
        // program headers and segments are mapped while the loader lock is
        // held (dl_iterate_phdr holds it).
        unsafe {
            let out = &mut *(data as *mut Vec<LoadedImage>);
            let info = &*(info as *const DlPhdrInfo);
            if let Some(image) = describe(info, out.is_empty()) {
                out.push(image);
            }
        }
        0
    }
    let mut out: Vec<LoadedImage> = Vec::new();
    // SAFETY: the callback's contract is documented above.
    unsafe { libc::dl_iterate_phdr(Some(each), (&raw mut out).cast()) };
    out
}

/// Builds a [`LoadedImage`] from a loader record.
///
/// # Safety
/// `info` must come from `dl_iterate_phdr`, inside its callback.
unsafe fn describe(info: &DlPhdrInfo, first: bool) -> Option<LoadedImage> {
    if info.phdr.is_null() || info.phnum == 0 {
        return None;
    }
    // SAFETY: the loader guarantees `phnum` headers at `phdr`.
    let phdrs = unsafe { std::slice::from_raw_parts(info.phdr, usize::from(info.phnum)) };
    // SAFETY: `info` comes from the callback (this function's contract).
    let (name, is_main) = unsafe { image_name(info, first) };
    let is_vdso = name.starts_with("linux-vdso") || name.starts_with("linux-gate");
    let path = if is_main {
        std::env::current_exe()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default()
    } else {
        name
    };
    let mapped = Mapped {
        phdrs,
        loads: phdrs.iter().filter(|p| p.p_type == PT_LOAD).collect(),
        bias: info.addr as u64,
        permanent: is_main || is_vdso,
    };
    let vmaddr = mapped.loads.iter().map(|p| p.p_vaddr).min()?;
    let vmend = mapped.loads.iter().map(|p| p.p_vaddr + p.p_memsz).max()?;
    // SAFETY: inside the loader's callback (this function's contract).
    let (eh_frame_hdr, eh_frame) = unsafe { mapped.eh_frame_sections() };
    let text = if is_main {
        // SAFETY: as above.
        unsafe { mapped.text() }
    } else {
        None
    };
    // SAFETY: as above.
    let build_id = unsafe { mapped.build_id() };
    Some(LoadedImage {
        path,
        bias: mapped.bias,
        start: vmaddr + mapped.bias,
        end: vmend + mapped.bias,
        vmaddr,
        eh_frame_hdr,
        eh_frame,
        text,
        code: mapped.code_ranges(),
        build_id,
    })
}

/// The loader's name for an image (empty for the main executable, which
/// comes first), and whether it is the main executable.
///
/// # Safety
/// `info` must come from `dl_iterate_phdr`, inside its callback.
unsafe fn image_name(info: &DlPhdrInfo, first: bool) -> (String, bool) {
    let name = if info.name.is_null() {
        String::new()
    } else {
        // SAFETY: a non-null `name` is a NUL-terminated string owned by the
        // loader, valid during the callback.
        unsafe { CStr::from_ptr(info.name) }
            .to_string_lossy()
            .into_owned()
    };
    let is_main = first && name.is_empty();
    (name, is_main)
}

/// One image's program headers and where its segments are mapped, read
/// inside the loader's callback.
struct Mapped<'a> {
    phdrs: &'a [Phdr],
    loads: Vec<&'a Phdr>,
    /// Load bias: a segment's `p_vaddr` plus this is its address.
    bias: u64,
    /// Never unloaded (the main executable, the vDSO): its bytes are
    /// borrowed, not copied.
    permanent: bool,
}

impl Mapped<'_> {
    /// The bytes at `svma..svma + len`.
    ///
    /// # Safety
    /// The range must lie inside a `PT_LOAD` segment of this image, and the
    /// call must be made inside the loader's callback (the segments stay
    /// mapped while the loader lock is held).
    unsafe fn grab(&self, svma: u64, len: u64) -> ImageBytes {
        // SAFETY: the range is mapped (this function's contract).
        let bytes: &'static [u8] =
            unsafe { std::slice::from_raw_parts((svma + self.bias) as *const u8, len as usize) };
        if self.permanent {
            ImageBytes::Static(bytes)
        } else {
            ImageBytes::Owned(bytes.into())
        }
    }

    /// The end of the file-backed part of the segment holding `svma`.
    fn segment_end(&self, svma: u64) -> Option<u64> {
        self.loads
            .iter()
            .find(|p| svma >= p.p_vaddr && svma < p.p_vaddr + p.p_filesz)
            .map(|p| p.p_vaddr + p.p_filesz)
    }

    /// `.eh_frame_hdr` and `.eh_frame` (from its start to the end of its
    /// segment), when the image has them.
    ///
    /// # Safety
    /// Inside the loader's callback.
    unsafe fn eh_frame_sections(&self) -> (Option<Section>, Option<Section>) {
        let Some(hdr) = self.phdrs.iter().find(|p| p.p_type == PT_GNU_EH_FRAME) else {
            return (None, None);
        };
        // SAFETY: the PT_GNU_EH_FRAME segment lies inside a PT_LOAD one.
        let hdr_bytes = unsafe { self.grab(hdr.p_vaddr, hdr.p_memsz) };
        let eh_frame = decode_eh_frame_ptr(&hdr_bytes, hdr.p_vaddr).and_then(|ptr| {
            let end = self.segment_end(ptr)?;
            Some(Section {
                svma: ptr,
                // SAFETY: `ptr..end` is the file-backed part of a PT_LOAD
                // segment (`segment_end`).
                bytes: unsafe { self.grab(ptr, end - ptr) },
            })
        });
        let eh_frame_hdr = Section {
            svma: hdr.p_vaddr,
            bytes: hdr_bytes,
        };
        (Some(eh_frame_hdr), eh_frame)
    }

    /// The first executable segment's bytes.
    ///
    /// # Safety
    /// Inside the loader's callback.
    unsafe fn text(&self) -> Option<Section> {
        let p = self.loads.iter().find(|p| p.p_flags & PF_X != 0)?;
        Some(Section {
            svma: p.p_vaddr,
            // SAFETY: a PT_LOAD segment's file-backed part.
            bytes: unsafe { self.grab(p.p_vaddr, p.p_filesz) },
        })
    }

    /// The address ranges of the executable segments.
    fn code_ranges(&self) -> Vec<(u64, u64)> {
        self.loads
            .iter()
            .filter(|p| p.p_flags & PF_X != 0)
            .map(|p| (p.p_vaddr + self.bias, p.p_vaddr + p.p_memsz + self.bias))
            .collect()
    }

    /// The GNU build id from the image's note segments.
    ///
    /// # Safety
    /// Inside the loader's callback.
    unsafe fn build_id(&self) -> Option<Vec<u8>> {
        self.phdrs
            .iter()
            .filter(|p| p.p_type == PT_NOTE)
            .find_map(|note| {
                // SAFETY: note segments lie inside a PT_LOAD segment, mapped
                // during the callback.
                let bytes = unsafe {
                    std::slice::from_raw_parts(
                        (note.p_vaddr + self.bias) as *const u8,
                        note.p_memsz as usize,
                    )
                };
                find_build_id(bytes, note.p_align.max(4) as usize).map(<[u8]>::to_vec)
            })
    }
}

/// Decodes `eh_frame_ptr` from an `.eh_frame_hdr` located at `hdr_svma`.
fn decode_eh_frame_ptr(hdr: &[u8], hdr_svma: u64) -> Option<u64> {
    if hdr.len() < 4 || hdr[0] != 1 {
        return None;
    }
    let enc = hdr[1];
    let field = hdr.get(4..)?;
    let (value, _) = read_encoded(field, enc & 0x0f)?;
    let base = match enc & 0x70 {
        0x00 => 0,
        0x10 => hdr_svma + 4, // DW_EH_PE_pcrel
        0x30 => hdr_svma,     // DW_EH_PE_datarel: relative to the header
        _ => return None,
    };
    Some(base.wrapping_add(value as u64))
}

fn read_encoded(b: &[u8], format: u8) -> Option<(i64, usize)> {
    Some(match format {
        0x00 | 0x04 => (i64::from_le_bytes(b.get(..8)?.try_into().ok()?), 8),
        0x03 => (
            i64::from(u32::from_le_bytes(b.get(..4)?.try_into().ok()?)),
            4,
        ),
        0x0b => (
            i64::from(i32::from_le_bytes(b.get(..4)?.try_into().ok()?)),
            4,
        ),
        0x0c => (i64::from_le_bytes(b.get(..8)?.try_into().ok()?), 8),
        _ => return None,
    })
}

/// Finds the `NT_GNU_BUILD_ID` descriptor in a note segment aligned to
/// `align` bytes (an alignment of 0 is read as 1).
///
/// As binutils and the kernel read notes, the descriptor starts at the
/// first aligned offset after the 12-byte header and the name, and the next
/// note at the first aligned offset after the descriptor. (With 4-byte
/// alignment that is the same as padding each size to 4; with 8-byte
/// alignment, as in `.note.gnu.property` segments, it is not.)
pub(crate) fn find_build_id(mut notes: &[u8], align: usize) -> Option<&[u8]> {
    let align = align.max(1);
    let align_up = |n: usize| n.checked_add(align - 1).map(|v| v / align * align);
    while notes.len() >= 12 {
        let namesz = u32::from_le_bytes(notes[0..4].try_into().ok()?) as usize;
        let descsz = u32::from_le_bytes(notes[4..8].try_into().ok()?) as usize;
        let kind = u32::from_le_bytes(notes[8..12].try_into().ok()?);
        let desc_start = align_up(12usize.checked_add(namesz)?)?;
        let desc_end = desc_start.checked_add(descsz)?;
        let next = align_up(desc_end)?;
        let name = notes.get(12..12 + namesz)?;
        if kind == NT_GNU_BUILD_ID && name == b"GNU\0" {
            return notes.get(desc_start..desc_end);
        }
        notes = notes.get(next..)?;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_self_with_unwind_tables_and_build_id() {
        let images = loaded_images();
        let exe = std::env::current_exe()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let main = images
            .iter()
            .find(|i| i.path == exe)
            .expect("main executable listed");
        assert!(main.eh_frame_hdr.is_some() && main.eh_frame.is_some());
        let here = finds_self_with_unwind_tables_and_build_id as *const () as usize as u64;
        assert!(main.start <= here && here < main.end);
        assert!(main.build_id.as_ref().is_some_and(|b| b.len() >= 16));
        assert!(images.iter().any(|i| i.path.contains("libc.so")));
        assert_ne!(image_generation(), 0);
    }

    #[test]
    fn parses_notes() {
        let mut n = Vec::new();
        n.extend_from_slice(&4u32.to_le_bytes());
        n.extend_from_slice(&3u32.to_le_bytes());
        n.extend_from_slice(&1u32.to_le_bytes());
        n.extend_from_slice(b"XYZ\0abc\0");
        n.extend_from_slice(&4u32.to_le_bytes());
        n.extend_from_slice(&4u32.to_le_bytes());
        n.extend_from_slice(&NT_GNU_BUILD_ID.to_le_bytes());
        n.extend_from_slice(b"GNU\0\x01\x02\x03\x04");
        assert_eq!(find_build_id(&n, 4), Some(&[1u8, 2, 3, 4][..]));
        assert_eq!(find_build_id(&n[..20], 4), None);
    }

    mod fuzz {
        use super::super::{NT_GNU_BUILD_ID, find_build_id};
        use crate::debug_id_from_build_id;
        use proptest::prelude::*;

        /// One note entry: name (without its NUL), type, descriptor.
        type Note = (Vec<u8>, u32, Vec<u8>);

        fn write_note(out: &mut Vec<u8>, (name, kind, desc): &Note, align: usize) {
            let pad = |out: &mut Vec<u8>| {
                while out.len() % align != 0 {
                    out.push(0);
                }
            };
            out.extend_from_slice(&(name.len() as u32 + 1).to_le_bytes());
            out.extend_from_slice(&(desc.len() as u32).to_le_bytes());
            out.extend_from_slice(&kind.to_le_bytes());
            out.extend_from_slice(name);
            out.push(0);
            pad(out);
            out.extend_from_slice(desc);
            pad(out);
        }

        /// Notes that are not a GNU build id: other owners (including
        /// near-misses of "GNU"), or GNU notes of other types.
        fn other_note() -> impl Strategy<Value = Note> {
            let name = prop_oneof![
                Just(b"GNU".to_vec()),
                Just(b"GNUX".to_vec()),
                Just(b"GN".to_vec()),
                Just(b"Go".to_vec()),
                Just(b"stapsdt".to_vec()),
                proptest::collection::vec(any::<u8>(), 0..12),
            ];
            (
                name,
                any::<u32>(),
                proptest::collection::vec(any::<u8>(), 0..40),
            )
                .prop_filter("not a GNU build id", |(name, kind, _)| {
                    !(name == b"GNU" && *kind == NT_GNU_BUILD_ID)
                })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            #[test]
            fn arbitrary_bytes_never_panic(
                bytes in proptest::collection::vec(any::<u8>(), 0..256),
                align in 0usize..=64,
            ) {
                if let Some(id) = find_build_id(&bytes, align) {
                    // Whatever it returns lies inside the input.
                    let range = bytes.as_ptr_range();
                    prop_assert!(id.is_empty() || range.contains(&id.as_ptr()));
                }
            }

            #[test]
            fn huge_sizes_never_panic(
                namesz in any::<u32>(),
                descsz in any::<u32>(),
                kind in any::<u32>(),
                tail in proptest::collection::vec(any::<u8>(), 0..64),
                align in prop_oneof![Just(4usize), Just(8), Just(usize::MAX / 2)],
            ) {
                let mut n = Vec::new();
                n.extend_from_slice(&namesz.to_le_bytes());
                n.extend_from_slice(&descsz.to_le_bytes());
                n.extend_from_slice(&kind.to_le_bytes());
                n.extend_from_slice(&tail);
                let _ = find_build_id(&n, align);
            }

            #[test]
            fn well_formed_notes_yield_the_build_id(
                before in proptest::collection::vec(other_note(), 0..5),
                after in proptest::collection::vec(other_note(), 0..3),
                id in proptest::collection::vec(any::<u8>(), 1..=64),
                align in prop_oneof![Just(4usize), Just(8)],
            ) {
                let mut n = Vec::new();
                for note in &before {
                    write_note(&mut n, note, align);
                }
                write_note(&mut n, &(b"GNU".to_vec(), NT_GNU_BUILD_ID, id.clone()), align);
                for note in &after {
                    write_note(&mut n, note, align);
                }
                prop_assert_eq!(find_build_id(&n, align), Some(&id[..]));
                // Cut anywhere inside the build-id note: never a wrong id.
                let start = n.len() - after_len(&after, align) - note_len(4, id.len(), align);
                for cut in start..n.len() {
                    if let Some(found) = find_build_id(&n[..cut], align) {
                        prop_assert_eq!(found, &id[..]);
                    }
                }
            }

            #[test]
            fn debug_id_is_a_uuid_with_swapped_guid_fields(
                id in proptest::collection::vec(any::<u8>(), 0..64),
            ) {
                let d = debug_id_from_build_id(&id);
                let parts: Vec<&str> = d.split('-').collect();
                prop_assert_eq!(
                    parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
                    vec![8, 4, 4, 4, 12]
                );
                prop_assert!(d.bytes().all(|b| b == b'-' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
                let hex: String = parts.concat();
                let bytes: Vec<u8> = (0..16)
                    .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
                    .collect();
                let mut want = [0u8; 16];
                let n = id.len().min(16);
                want[..n].copy_from_slice(&id[..n]);
                want[0..4].reverse();
                want[4..6].reverse();
                want[6..8].reverse();
                prop_assert_eq!(&bytes[..], &want[..]);
            }
        }

        /// The size of a note whose name (with its NUL) and descriptor have
        /// these sizes.
        fn note_len(namesz: usize, descsz: usize, align: usize) -> usize {
            let up = |v: usize| v.div_ceil(align) * align;
            up(up(12 + namesz) + descsz)
        }

        fn after_len(after: &[Note], align: usize) -> usize {
            after
                .iter()
                .map(|(name, _, desc)| note_len(name.len() + 1, desc.len(), align))
                .sum()
        }
    }
}
