//! Standard output of the commands: a reader that stops reading (`imagepipe status ID | head -3`)
//! ends the command quietly instead of a `println!` panic with a backtrace.

use std::fmt;
use std::io::{self, ErrorKind, Write};

/// Writes `args` to standard output and flushes it. A closed pipe ends the process with
/// status 0 (the reader has what it wanted); any other error ends it with a one-line message.
pub fn write(args: fmt::Arguments<'_>) {
    let mut out = io::stdout().lock();
    settle(out.write_fmt(args).and_then(|()| out.flush()));
}

/// Writes `bytes` (an image) to standard output, as [`write`] does text.
pub fn write_bytes(bytes: &[u8]) {
    let mut out = io::stdout().lock();
    settle(out.write_all(bytes).and_then(|()| out.flush()));
}

fn settle(written: io::Result<()>) {
    if let Err(e) = written {
        if e.kind() == ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("imagepipe: writing to standard output: {e}");
        std::process::exit(1);
    }
}

/// `print!` to standard output through [`write`].
macro_rules! out {
    ($($arg:tt)*) => { $crate::cmd::output::write(format_args!($($arg)*)) };
}

/// `println!` to standard output through [`write`].
macro_rules! outln {
    () => { $crate::cmd::output::write(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::cmd::output::write(format_args!("{}\n", format_args!($($arg)*))) };
}
