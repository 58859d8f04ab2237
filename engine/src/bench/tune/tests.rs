use super::*;

#[test]
fn products_follow_each_family_layout() {
    let gpt2 = step_products("gpt2", 4, 1024, 8192, true).unwrap();
    // 4 linears x 3 products + the head's 3, and a 16-bit twin of each product whose B is a weight.
    assert_eq!(gpt2.len(), 15 + 10);
    let qkv = &gpt2[0];
    assert_eq!((qkv.shape.m, qkv.shape.n, qkv.shape.k), (4096, 2304, 768));
    assert_eq!(MatmulClass::of(&qkv.shape, false).key(), "nn/f32/m24/n22/k19");
    let llama = step_products("llama-3.2-1b", 1, 64, 8192, false).unwrap();
    assert_eq!(llama.len(), 7 * 3 + 3);
    assert!(llama[0].name.contains("q_proj forward") && llama[0].shape.b.row_stride == 1, "nn.Linear's forward reads W^T");
    let lm_dw = llama.last().unwrap();
    assert_eq!((lm_dw.shape.m, lm_dw.shape.n, lm_dw.shape.k), (8192, 2048, 64));
    assert!(step_products("gpt3", 1, 1, 1, false).unwrap_err().to_string().contains("gpt3"));
}

#[test]
fn utc_dates_are_civil() {
    let now = utc_now();
    assert_eq!(now.len(), 20);
    assert!(now.starts_with("20") && now.ends_with('Z'), "{now}");
}
