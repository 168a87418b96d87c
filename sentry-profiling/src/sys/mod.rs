//! The crate's system calls, and the `unsafe` code they need: signals, the
//! thread list, stack mappings, clocks and the loaded-image list. (Two
//! other places hold `unsafe` code, each for its own data structure:
//! `lanes/ring.rs`, a single-writer ring's slots, and `symbolize`, an ELF
//! file mapped to read its symbols.)
//!
//! The rest of the crate talks to the operating system only through the safe
//! functions exported here. Only Linux on x86_64 and aarch64 is supported
//! (`build.rs` sets `cfg(profiling_supported)` there); elsewhere this module is
//! empty and [`crate::Sampler::start`] returns [`crate::Error::Unsupported`].

#[cfg(profiling_supported)]
mod arch;
#[cfg(profiling_supported)]
mod blocked;
#[cfg(profiling_supported)]
mod fork;
#[cfg(profiling_supported)]
mod images;
#[cfg(profiling_supported)]
mod maps;
#[cfg(profiling_supported)]
mod signal;
#[cfg(profiling_supported)]
mod thread;

#[cfg(profiling_supported)]
pub(crate) use blocked::{SyscallState, TaskFile, probe_proc_mem, read_own_memory};
#[cfg(profiling_supported)]
pub(crate) use fork::{in_forked_child, watch_fork};
#[cfg(profiling_supported)]
pub(crate) use images::{ImageBytes, LoadedImage, Section, image_generation, loaded_images};
#[cfg(profiling_supported)]
pub(crate) use maps::{StackMappings, stack_mappings};
#[cfg(profiling_supported)]
pub(crate) use signal::{
    CpuTimer, FLAG_OFF_STACK, FLAG_TIMER, ProcessTimer, Regs, SendError, Slot, SlotState,
    completion_seq, ensure_spares, forget_known, install_handler, mark_known, probe_cpu_timer,
    probe_signal, probe_vm_read, process_timer_counts, send_sample_signal, set_thread_context,
    signal_restorers, spare_slots, thread_context, wait_completion, wake_completion_waiters,
};
#[cfg(profiling_supported)]
pub(crate) use thread::{
    TaskList, ThreadInfo, current_tid, kept_tid, kernel_release, own_cpu_time_ns, page_size,
    process_cpu_time_ns, read_thread_identity, realtime_ns, thread_age, thread_cpu_time_ns,
};

/// Without a sampler there is nothing a forked child could wait for.
#[cfg(not(profiling_supported))]
pub(crate) fn watch_fork() {}

/// Without a sampler there is nothing a forked child could wait for.
#[cfg(not(profiling_supported))]
pub(crate) fn in_forked_child() -> bool {
    false
}
