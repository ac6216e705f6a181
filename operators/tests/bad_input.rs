//! Bad input is an error that names what is wrong, never a panic.

use dualgp_operators::model::dual::estep::e_step;
use dualgp_operators::model::math::linalg::cholesky_jittered;
use dualgp_operators::model::{
    Data, DualPosterior, EStepConfig, Family, Kernel, Likelihood, Link, ModelError, PointSites,
};
use nalgebra::{dmatrix, DMatrix, DVector};

fn kernel() -> Kernel {
    Kernel::stationary(Family::Matern52, 1.0, vec![1.0])
}

fn grid(n: usize, d: usize) -> DMatrix<f64> {
    DMatrix::from_fn(n, d, |i, j| (i * d + j) as f64 * 0.1)
}

#[test]
fn non_finite_features_and_labels_name_their_row() {
    let mut x = grid(5, 2);
    x[(3, 1)] = f64::NAN;
    let err = Data::new(x, DVector::zeros(5)).unwrap_err();
    assert_eq!(
        err,
        ModelError::NonFinite {
            row: 3,
            what: "feature 1".into()
        }
    );
    assert_eq!(err.to_string(), "row 3: feature 1 is not finite");

    let mut y = DVector::zeros(5);
    y[4] = f64::INFINITY;
    let err = Data::new(grid(5, 2), y).unwrap_err();
    assert_eq!(
        err,
        ModelError::NonFinite {
            row: 4,
            what: "label".into()
        }
    );
}

#[test]
fn ragged_rows_and_mismatched_lengths_are_dimension_errors() {
    let err = Data::from_rows(&[vec![1.0, 2.0], vec![3.0]], &[0.0, 1.0]).unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::Dimension {
                expected: 2,
                got: 1,
                ..
            }
        ),
        "{err}"
    );
    let err = Data::new(grid(3, 2), DVector::zeros(4)).unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::Dimension {
                expected: 3,
                got: 4,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn inputs_of_the_wrong_dimension_are_refused_by_the_e_step() {
    let lik = Likelihood::Gaussian { variance: 0.1 };
    let mut post = DualPosterior::new(kernel(), grid(4, 2), 1).unwrap();
    let data = Data::new(grid(6, 3), DVector::zeros(6)).unwrap();
    let mut sites = PointSites::zeros(6, 1);
    let err = e_step(&mut post, &lik, &data, &mut sites, &EStepConfig::default()).unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::Dimension {
                expected: 2,
                got: 3,
                ..
            }
        ),
        "{err}"
    );
}

fn label_error(lik: Likelihood, bad: f64) -> ModelError {
    let mut y = DVector::zeros(6);
    y[2] = bad;
    let data = Data::new(grid(6, 2), y).unwrap();
    let mut post = DualPosterior::new(kernel(), grid(3, 2), lik.n_latent()).unwrap();
    let mut sites = PointSites::zeros(6, lik.n_latent());
    e_step(&mut post, &lik, &data, &mut sites, &EStepConfig::default()).unwrap_err()
}

#[test]
fn labels_outside_the_likelihood_support_name_their_row() {
    let cases = [
        (Likelihood::Bernoulli { link: Link::Probit }, 2.0),
        (Likelihood::Bernoulli { link: Link::Logit }, -1.0),
        (Likelihood::Poisson, -3.0),
        (Likelihood::Poisson, 1.5),
        (
            Likelihood::Softmax {
                classes: 3,
                samples: 8,
                seed: 0,
            },
            3.0,
        ),
        (
            Likelihood::Softmax {
                classes: 3,
                samples: 8,
                seed: 0,
            },
            0.5,
        ),
    ];
    for (lik, bad) in cases {
        let err = label_error(lik.clone(), bad);
        match &err {
            ModelError::InvalidLabel { row: 2, label, .. } => assert_eq!(*label, bad),
            other => panic!("{lik:?} with label {bad}: expected an invalid-label error on row 2, got {other}"),
        }
        assert!(err.to_string().starts_with("row 2: label"), "{err}");
    }
}

#[test]
fn duplicated_inducing_inputs_raise_the_jitter_instead_of_failing() {
    let z = dmatrix![0.0, 0.0; 0.0, 0.0; 1.0, 1.0];
    let mut post = DualPosterior::new(kernel(), z, 1).unwrap();
    post.jitter = 0.0;
    post.refresh().unwrap();
    assert!(post.jitter > 0.0, "the singular K(Z, Z) needed jitter");
}

#[test]
fn an_indefinite_matrix_fails_after_the_jitter_reaches_its_bound() {
    let a = dmatrix![1.0, 2.0; 2.0, 1.0];
    match cholesky_jittered(&a, 1e-6, "test") {
        Err(ModelError::Cholesky { jitter, .. }) => assert!(jitter > 1e-6 && jitter <= 1e-2),
        other => panic!("expected a Cholesky error, got {other:?}"),
    }
}

#[test]
fn invalid_kernels_and_settings_are_configuration_errors() {
    let bad = Kernel::stationary(Family::Matern52, -1.0, vec![1.0]);
    assert!(matches!(
        DualPosterior::new(bad, grid(3, 2), 1),
        Err(ModelError::Config(_))
    ));
    let ard = Kernel::stationary(Family::Matern52, 1.0, vec![1.0, 1.0, 1.0]);
    assert!(matches!(
        DualPosterior::new(ard, grid(3, 2), 1),
        Err(ModelError::Config(_))
    ));
    let rho = EStepConfig { steps: 1, rho: 1.5 };
    assert!(matches!(rho.validate(), Err(ModelError::Config(_))));
}
