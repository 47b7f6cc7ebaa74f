//! Multi-tensor launches: one kernel over a list of buffers instead of one launch a buffer, for the
//! work a step does on every parameter or gradient (AdamW, the gradient norm, zeroing the gradients
//! that accumulate). The list goes to the kernel as a table in device memory (`kernels/common.cuh`:
//! `mt_entry` and the `MT_*` word indices), uploaded again only when it changes: a model's buffers
//! are the same from step to step, so after the first step a launch costs no copy. Each entry gets
//! the blocks a launch of its buffer alone would have had, so a kernel that gives each block the
//! same elements gives the same bits as one launch a buffer.

use super::CudaError;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use std::sync::Arc;

/// Words of a table entry (`kernels/common.cuh`: MT_WORDS); the layout is [`Entry::words`]'s.
const WORDS: usize = 8;

/// One buffer of a multi-tensor launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Entry {
    /// Blocks that work on it.
    pub blocks: usize,
    /// Its values (or, for a kernel that says so, its 4-byte words).
    pub n: usize,
    /// Held in BF16 (2 bytes a value) rather than f32.
    pub bf16: bool,
    /// Its device addresses, in the kernel's order (unused ones 0).
    pub ptrs: [u64; 4],
}

impl Entry {
    /// The table words of this entry, its first block being `first` (MT_START, MT_BLOCKS, MT_N,
    /// MT_FLAGS, then MT_PTR's four addresses).
    fn words(&self, first: usize) -> [u64; WORDS] {
        let [a, b, c, d] = self.ptrs;
        [first as u64, self.blocks as u64, self.n as u64, self.bf16 as u64, a, b, c, d]
    }
}

/// A multi-tensor table kept on the device, with the host copy it was uploaded from.
#[derive(Default)]
pub(super) struct TensorTable {
    host: Vec<u64>,
    dev: Option<CudaSlice<u64>>,
}

/// A table ready for a launch: its device address, its entries and the blocks of all of them.
#[derive(Clone, Copy, Debug)]
pub(super) struct Uploaded {
    pub table: u64,
    pub count: i32,
    pub blocks: u32,
}

impl TensorTable {
    /// The table of `entries` on the device, uploaded on `stream` only when it differs from the
    /// last one (a copy ordered before the launches that follow it on that stream).
    pub fn upload(&mut self, stream: &Arc<CudaStream>, entries: &[Entry]) -> Result<Uploaded, CudaError> {
        if entries.is_empty() || entries.iter().any(|e| e.blocks == 0) {
            return Err(CudaError::Unsupported(format!("a multi-tensor launch of {} buffers, one of them with no blocks", entries.len())));
        }
        let mut host = Vec::with_capacity(entries.len() * WORDS);
        let mut first = 0usize;
        for e in entries {
            host.extend_from_slice(&e.words(first));
            first += e.blocks;
        }
        self.upload_words(stream, host, entries.len(), first)
    }

    /// A table of `count` entries already laid out as their kernel reads them (`host`, each entry
    /// starting with its first block), `blocks` in all, on the device: uploaded on `stream` only
    /// when it differs from the last one.
    pub fn upload_words(&mut self, stream: &Arc<CudaStream>, host: Vec<u64>, count: usize, blocks: usize) -> Result<Uploaded, CudaError> {
        let blocks = u32::try_from(blocks).map_err(|_| CudaError::Unsupported(format!("a multi-tensor launch of {blocks} blocks")))?;
        if self.dev.is_none() || host != self.host {
            self.dev = Some(stream.clone_htod(&host)?);
            self.host = host;
        }
        let Some(dev) = self.dev.as_ref() else { unreachable!("uploaded above") };
        let (table, _sync) = dev.device_ptr(stream);
        Ok(Uploaded { table, count: count as i32, blocks })
    }
}

/// The tables of a step's launches of one kernel, one a launch in the order of the step: a step
/// that launches what the last one did uploads none.
#[derive(Default)]
pub(super) struct StepTables {
    tables: Vec<TensorTable>,
    /// Launches since the step began (the next one's table).
    next: usize,
}

impl StepTables {
    /// The step's next launch's table of `count` entries laid out as their kernel reads them
    /// (`host`), `blocks` in all ([`TensorTable::upload_words`]).
    pub fn upload_next(&mut self, stream: &Arc<CudaStream>, host: Vec<u64>, count: usize, blocks: usize) -> Result<Uploaded, CudaError> {
        if self.tables.len() == self.next {
            self.tables.push(TensorTable::default());
        }
        self.next += 1;
        self.tables[self.next - 1].upload_words(stream, host, count, blocks)
    }

    /// A new step: its first launch takes the first table again.
    pub fn restart(&mut self) {
        self.next = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_take_consecutive_blocks() {
        let e = |blocks, n| Entry { blocks, n, bf16: n % 2 == 1, ptrs: [n as u64 * 16, 0, 0, 0] };
        let entries = [e(3, 10), e(1, 7), e(4, 100)];
        let mut first = 0;
        let words: Vec<[u64; WORDS]> = entries
            .iter()
            .map(|x| {
                let w = x.words(first);
                first += x.blocks;
                w
            })
            .collect();
        assert_eq!(words.iter().map(|w| w[0]).collect::<Vec<_>>(), vec![0, 3, 4]);
        assert_eq!(words[1], [3, 1, 7, 1, 112, 0, 0, 0]);
        assert_eq!(first, 8);
    }

    #[test]
    fn the_kernels_read_the_layout_written_here() {
        let common = include_str!("../../../../kernels/common.cuh");
        for (name, value) in [("MT_WORDS", WORDS), ("MT_START", 0), ("MT_BLOCKS", 1), ("MT_N", 2), ("MT_FLAGS", 3), ("MT_PTR", 4)] {
            assert!(common.lines().any(|l| l == format!("#define {name} {value}")), "kernels/common.cuh: #define {name} {value}");
        }
    }
}
