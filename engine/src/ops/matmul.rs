//! matmul: C (M, N) = A (M, K) @ B (K, N) [+ bias (N)] [+ C], every operand addressed by strides, and
//! bias_backward: dbias (N) += column sums of dout (M, N).
//!
//! One strided product serves forward and both backward products of a linear layer: a transposed
//! operand is the same buffer with its strides swapped (see [`Operand::transposed`]).

use rayon::prelude::*;

/// Where an operand's elements live: element (r, c) is at `offset + r * row_stride + c * col_stride`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Operand {
    pub offset: usize,
    pub row_stride: usize,
    pub col_stride: usize,
}

impl Operand {
    /// A row-major matrix with `cols` columns.
    pub fn row_major(cols: usize) -> Self {
        Operand { offset: 0, row_stride: cols, col_stride: 1 }
    }
    /// The transpose of a row-major matrix with `cols` columns: element (r, c) is stored at (c, r).
    pub fn transposed(cols: usize) -> Self {
        Operand { offset: 0, row_stride: 1, col_stride: cols }
    }
    /// Index of element (r, c).
    pub fn at(&self, r: usize, c: usize) -> usize {
        self.offset + r * self.row_stride + c * self.col_stride
    }
    /// The smallest and one past the largest element index touched by rows `rows` and columns `cols`.
    pub fn span(&self, rows: std::ops::Range<usize>, cols: std::ops::Range<usize>) -> std::ops::Range<usize> {
        if rows.is_empty() || cols.is_empty() {
            return self.offset..self.offset;
        }
        self.at(rows.start, cols.start)..self.at(rows.end - 1, cols.end - 1) + 1
    }
}

/// The shape of one product: C (m, n) = A (m, k) @ B (k, n). C is always row-major-like (unit column stride).
#[derive(Clone, Copy, Debug)]
pub struct MatmulShape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: Operand,
    pub b: Operand,
    pub c: Operand,
}

impl MatmulShape {
    /// All three operands row-major: C (m, n) = A (m, k) @ B (k, n).
    pub fn row_major(m: usize, n: usize, k: usize) -> Self {
        MatmulShape { m, n, k, a: Operand::row_major(k), b: Operand::row_major(n), c: Operand::row_major(n) }
    }
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

/// Rows of C computed per rayon task: large enough for matrixmultiply's packing to pay off.
const ROWS_PER_TASK: usize = 64;

/// C = A @ B (+ bias) (+ C if `accumulate`). The CPU twin of `matmul.wgsl`, with the product itself from
/// the `matrixmultiply` crate.
pub fn matmul(c: &mut [f32], a: &[f32], b: &[f32], bias: Option<&[f32]>, s: &MatmulShape, accumulate: bool) {
    assert_eq!(s.c.col_stride, 1, "matmul: C must have unit column stride");
    if s.m == 0 || s.n == 0 {
        return;
    }
    let c_row = s.c.row_stride;
    let c = &mut c[s.c.offset..];
    let rows_in = |len: usize| len.div_ceil(c_row);
    // Split C into disjoint blocks of rows, one rayon task each.
    let block = ROWS_PER_TASK * c_row;
    let needed = (s.m - 1) * c_row + s.n;
    c[..needed].par_chunks_mut(block).enumerate().for_each(|(task, c_block)| {
        let row0 = task * ROWS_PER_TASK;
        let rows = rows_in(c_block.len()).min(s.m - row0);
        // SAFETY: the pointers index inside the slices for all (r < rows, k < s.k, n < s.n), as the
        // strides and offsets come with slices of matching length (checked by the asserts below).
        assert!(s.a.span(row0..row0 + rows, 0..s.k.max(1)).end <= a.len() || s.k == 0);
        assert!(s.b.span(0..s.k.max(1), 0..s.n).end <= b.len() || s.k == 0);
        let beta = if accumulate { 1.0 } else { 0.0 };
        if s.k == 0 {
            for r in 0..rows {
                for x in &mut c_block[r * c_row..r * c_row + s.n] {
                    *x *= beta;
                }
            }
        } else {
            unsafe {
                matrixmultiply::sgemm(
                    rows,
                    s.k,
                    s.n,
                    1.0,
                    a.as_ptr().add(s.a.at(row0, 0)),
                    s.a.row_stride as isize,
                    s.a.col_stride as isize,
                    b.as_ptr().add(s.b.offset),
                    s.b.row_stride as isize,
                    s.b.col_stride as isize,
                    beta,
                    c_block.as_mut_ptr(),
                    c_row as isize,
                    1,
                );
            }
        }
        if let Some(bias) = bias {
            for r in 0..rows {
                for (x, bv) in c_block[r * c_row..r * c_row + s.n].iter_mut().zip(bias) {
                    *x += bv;
                }
            }
        }
    });
}

/// dbias (N) += sum over the M rows of dout (M, N). The CPU twin of `bias_backward.wgsl`.
pub fn bias_backward(dbias: &mut [f32], dout: &[f32], m: usize, n: usize) {
    dbias[..n].par_iter_mut().enumerate().for_each(|(col, db)| {
        let mut sum = 0.0f32;
        for r in 0..m {
            sum += dout[r * n + col];
        }
        *db += sum;
    });
}
