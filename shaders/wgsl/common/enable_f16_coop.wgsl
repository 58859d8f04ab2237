// The enable directives of matmul_coop.wgsl, which must precede every declaration, so they are prepended
// before the helpers it shares with other kernels (common/f16_bits.wgsl).
enable f16;
enable wgpu_cooperative_matrix;
