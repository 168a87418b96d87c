//! A value on a cache line of its own.

/// `T` alone on its cache line: for a counter the application's threads
/// write on every request, so that each write does not also take from
/// their cores the line of the fields they only read (the session's flags,
/// the lane queue's sender), which the compiler may place beside it.
#[repr(align(64))]
#[derive(Debug, Default)]
pub(crate) struct OwnLine<T>(pub(crate) T);

impl<T> std::ops::Deref for OwnLine<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}
