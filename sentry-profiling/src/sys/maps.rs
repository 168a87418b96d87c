//! Writable memory mappings of this process (`/proc/self/maps`), used to
//! bound each thread's stack copy to the mapping its stack pointer is in.

/// Readable and writable private mappings, sorted by start address.
#[derive(Debug, Default, Clone)]
pub(crate) struct StackMappings {
    ranges: Vec<(usize, usize)>,
    main_stack_top: Option<usize>,
}

impl StackMappings {
    /// The mapping `[lo, hi)` that contains `addr`, if any.
    pub(crate) fn find(&self, addr: usize) -> Option<(usize, usize)> {
        let idx = self.ranges.partition_point(|&(lo, _)| lo <= addr);
        let (lo, hi) = *self.ranges.get(idx.checked_sub(1)?)?;
        (addr < hi).then_some((lo, hi))
    }

    /// The top of the main thread's stack (`[stack]`), which never moves.
    pub(crate) fn main_stack_top(&self) -> Option<usize> {
        self.main_stack_top
    }

    fn parse(text: &str) -> Self {
        let mut ranges = Vec::new();
        let mut main_stack_top = None;
        for line in text.lines() {
            let mut fields = line.split_whitespace();
            let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
                continue;
            };
            // Only private read-write mappings can be stacks; shared or
            // read-only mappings (files, code) are never copied from.
            if !perms.starts_with("rw") || !perms.ends_with('p') {
                continue;
            }
            let Some((lo, hi)) = range.split_once('-') else {
                continue;
            };
            if let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                ranges.push((lo, hi));
                if line.trim_end().ends_with("[stack]") {
                    main_stack_top = Some(hi);
                }
            }
        }
        ranges.sort_unstable();
        Self {
            ranges,
            main_stack_top,
        }
    }
}

/// Reads the current mappings.
pub(crate) fn stack_mappings() -> StackMappings {
    std::fs::read_to_string("/proc/self/maps")
        .map(|t| StackMappings::parse(&t))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_mapping_of_a_local() {
        let local = 5u64;
        let addr = std::ptr::from_ref(&local) as usize;
        let (lo, hi) = stack_mappings().find(addr).expect("stack mapped rw");
        assert!(lo <= addr && addr < hi);
    }

    #[test]
    fn skips_read_only_and_shared() {
        let m = StackMappings::parse(
            "1000-2000 r-xp 0 0:0 0 /bin/x\n3000-4000 rw-s 0 0:0 0\n5000-6000 rw-p 0 0:0 0 [stack]\n",
        );
        assert_eq!(m.find(0x1800), None);
        assert_eq!(m.find(0x3800), None);
        assert_eq!(m.find(0x5000), Some((0x5000, 0x6000)));
        assert_eq!(m.find(0x6000), None);
        assert_eq!(m.main_stack_top(), Some(0x6000));
    }
}
