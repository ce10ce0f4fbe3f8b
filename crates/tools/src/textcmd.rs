//! `tokenize` and `detokenize`.

use anyhow::{bail, Context, Result};

use crate::runtime;
use crate::ModelArgs;

pub fn tokenize(m: &ModelArgs, parse_special: bool, text: &str) -> Result<()> {
    let tok = runtime::tokenizer(&runtime::open(m)?)?;
    let ids = tok.encode(text, parse_special)?;
    println!("{}", serde_json::to_string(&ids)?);
    Ok(())
}

/// Accepts a JSON array (`[1, 2]`) or ids separated by spaces or commas.
pub fn parse_ids(args: &[String]) -> Result<Vec<u32>> {
    let joined = args.join(" ");
    let trimmed = joined.trim();
    if trimmed.starts_with('[') {
        return serde_json::from_str(trimmed).context("token ids must be a JSON array of non-negative integers");
    }
    let ids = trimmed
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u32>().with_context(|| format!("{s:?} is not a token id")))
        .collect::<Result<Vec<_>>>()?;
    Ok(ids)
}

pub fn detokenize(m: &ModelArgs, args: &[String]) -> Result<()> {
    let ids = parse_ids(args)?;
    if ids.is_empty() {
        bail!("no token ids given");
    }
    let tok = runtime::tokenizer(&runtime::open(m)?)?;
    let bytes = tok.decode_bytes(&ids)?;
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(&bytes)?;
    out.write_all(b"\n")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse_from_json_or_separated_lists() {
        assert_eq!(parse_ids(&["[1, 2,3]".into()]).unwrap(), vec![1, 2, 3]);
        assert_eq!(parse_ids(&["4".into(), "5,6".into()]).unwrap(), vec![4, 5, 6]);
        assert!(parse_ids(&["-1".into()]).is_err());
        assert!(parse_ids(&["[1, \"x\"]".into()]).is_err());
    }
}
