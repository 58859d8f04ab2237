//! The step loop's progress bar: indicatif's with the `progress` feature (on by default), else no bar,
//! the lines it would have printed above itself going to stderr instead. Lines from elsewhere (a wait
//! for the GPU that goes on) go above the bar too, through [`eprint_above_bar`].

/// The bar drawn now, if any: where [`eprint_above_bar`] prints.
#[cfg(feature = "progress")]
static DRAWN: std::sync::Mutex<Option<indicatif::ProgressBar>> = std::sync::Mutex::new(None);

/// Prints `line` on stderr, above the progress bar while one is drawn (not through it).
pub(crate) fn eprint_above_bar(line: &str) {
    #[cfg(feature = "progress")]
    if let Some(bar) = DRAWN.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        return bar.println(line);
    }
    eprintln!("{line}");
}

/// A progress bar over the optimizer steps, or nothing.
pub(crate) struct Progress {
    #[cfg(feature = "progress")]
    bar: indicatif::ProgressBar,
}

impl Progress {
    /// A bar of `len` steps at `position`, drawn on stderr when `show`.
    pub(crate) fn new(len: u64, position: u64, show: bool) -> Self {
        #[cfg(feature = "progress")]
        {
            let bar = if show { indicatif::ProgressBar::new(len) } else { indicatif::ProgressBar::hidden() };
            bar.set_style(
                indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}")
                    .expect("a valid template"),
            );
            bar.set_position(position);
            if !bar.is_hidden() {
                *DRAWN.lock().unwrap_or_else(|e| e.into_inner()) = Some(bar.clone());
            }
            Progress { bar }
        }
        #[cfg(not(feature = "progress"))]
        {
            let _ = (len, position, show);
            Progress {}
        }
    }

    /// No bar is drawn: lines go straight to stderr.
    pub(crate) fn is_hidden(&self) -> bool {
        #[cfg(feature = "progress")]
        return self.bar.is_hidden();
        #[cfg(not(feature = "progress"))]
        true
    }

    /// Prints `line` above the bar (or to stderr when there is none).
    pub(crate) fn println(&self, line: String) {
        #[cfg(feature = "progress")]
        if !self.bar.is_hidden() {
            return self.bar.println(line);
        }
        eprintln!("{line}");
    }

    /// One more step done, described by `message`.
    pub(crate) fn step(&self, message: String) {
        #[cfg(feature = "progress")]
        {
            self.bar.set_message(message);
            self.bar.inc(1);
        }
        #[cfg(not(feature = "progress"))]
        let _ = message;
    }

    pub(crate) fn finish(&self) {
        #[cfg(feature = "progress")]
        self.bar.finish_and_clear();
    }
}

impl Drop for Progress {
    /// However the step loop ends, later lines are printed plainly.
    fn drop(&mut self) {
        // Only the bar this one drew: another rank's hidden bar must not clear the lead's.
        #[cfg(feature = "progress")]
        if !self.bar.is_hidden() {
            DRAWN.lock().unwrap_or_else(|e| e.into_inner()).take();
        }
    }
}
