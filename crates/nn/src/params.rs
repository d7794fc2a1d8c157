//! Flat parameter storage: every dense parameter lives in one `Vec<f32>` at a fixed offset, so
//! gradients, optimizer state and shard reductions are single flat loops.

/// Name, shape and location of one parameter tensor in the flat buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamSpec {
    /// Stable name, e.g. `mlp.0.weight` (used by checkpoints).
    pub name: String,
    /// Shape (row-major); weights are `[in, out]`.
    pub shape: Vec<usize>,
    /// Offset in the flat buffer.
    pub offset: usize,
    /// Number of elements.
    pub len: usize,
}

/// Layout of all parameters; values are kept by the owner.
#[derive(Clone, Debug, Default)]
pub struct ParamLayout {
    specs: Vec<ParamSpec>,
    total: usize,
}

impl ParamLayout {
    /// Registers a tensor and returns its offset.
    pub fn add(&mut self, name: impl Into<String>, shape: &[usize]) -> usize {
        let len = shape.iter().product();
        let offset = self.total;
        self.specs.push(ParamSpec {
            name: name.into(),
            shape: shape.to_vec(),
            offset,
            len,
        });
        self.total += len;
        offset
    }

    /// All tensors, in registration order.
    pub fn specs(&self) -> &[ParamSpec] {
        &self.specs
    }

    /// Total number of scalars.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Looks a tensor up by name.
    pub fn find(&self, name: &str) -> Option<&ParamSpec> {
        self.specs.iter().find(|s| s.name == name)
    }
}

/// Two disjoint ranges of `g`, both mutable (a layer's weight and bias gradients).
pub(crate) fn disjoint_mut(
    g: &mut [f32],
    a: std::ops::Range<usize>,
    b: std::ops::Range<usize>,
) -> (&mut [f32], &mut [f32]) {
    if a.end <= b.start {
        let (lo, hi) = g.split_at_mut(b.start);
        (&mut lo[a], &mut hi[..b.end - b.start])
    } else {
        assert!(
            b.end <= a.start,
            "overlapping parameter ranges {a:?} and {b:?}"
        );
        let (lo, hi) = g.split_at_mut(a.start);
        (&mut hi[..a.end - a.start], &mut lo[b])
    }
}
