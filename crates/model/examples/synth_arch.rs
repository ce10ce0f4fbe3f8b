//! Writes one synthetic model of `model::tiny::Variant` as a GGUF file, for
//! scripts/arch-references.sh to run llama.cpp on.
//!
//!   cargo run -p model --example synth_arch -- --arch qwen2 --out qwen2.gguf

use model::tiny::{arch_gguf, Variant};

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let names: Vec<&str> = Variant::ALL.iter().map(|v| v.name()).collect();
    let usage = format!("usage: synth_arch --arch {{{}}} --out FILE", names.join("|"));
    let arch = value("--arch").ok_or_else(|| usage.clone())?;
    let out = value("--out").ok_or_else(|| usage.clone())?;
    let variant = Variant::from_name(&arch).ok_or_else(|| format!("unknown variant {arch:?}; {usage}"))?;
    std::fs::write(&out, arch_gguf(&variant.spec())).map_err(|e| format!("{out}: {e}"))
}
