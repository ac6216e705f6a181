//! Whether a model an update is about to publish can be used. A non-finite
//! objective or gradient that the M-step could not step back from, or a
//! factorisation that rounding broke, leaves non-finite numbers in the
//! hyperparameters or the site totals; such a model would score every later
//! record NaN. The reducing worker checks the model before the workers take
//! it, and an update whose model fails the check fails as a whole. A panic
//! caught on the data path is reported with what it said.

use nalgebra::DMatrix;

use crate::model::Snapshot;

/// Why `model` cannot be used, if it cannot.
pub(super) fn unusable(model: &Snapshot) -> Option<String> {
    let post = &model.posterior;
    fn finite<'a>(mut values: impl Iterator<Item = &'a f64>) -> bool {
        values.all(|v| v.is_finite())
    }
    if !finite(post.kernel.log_params().iter()) {
        return Some(format!(
            "non-finite kernel hyperparameters {:?}",
            post.kernel.log_params()
        ));
    }
    if !finite(model.likelihood.log_params().iter()) {
        return Some(format!(
            "non-finite likelihood hyperparameters {:?}",
            model.likelihood.log_params()
        ));
    }
    if !post.jitter.is_finite() || !finite(post.z.iter()) {
        return Some("non-finite inducing inputs or jitter".into());
    }
    if !post
        .whitened
        .iter()
        .all(|s| finite(s.l.iter()) && finite(s.lambda.iter()))
    {
        return Some("non-finite site totals".into());
    }
    let mut factorised = model.clone();
    if let Err(e) = factorised.ensure_factors() {
        return Some(e.to_string());
    }
    // What scoring would give at the inducing inputs.
    let marginals = factorised.posterior.predict_f(&post.z);
    let bad = |m: &DMatrix<f64>| !finite(m.iter());
    if bad(&marginals.mean) || bad(&marginals.var) {
        return Some("non-finite predictions at the inducing inputs".into());
    }
    None
}

/// What a caught panic said, when it said it as text.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}
