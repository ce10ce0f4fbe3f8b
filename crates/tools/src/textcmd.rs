//! `tokenize` and `detokenize`.

use crate::runtime;
use crate::{ModelArgs, ToolError};

pub fn tokenize(m: &ModelArgs, parse_special: bool, text: &str) -> Result<(), ToolError> {
    let tok = runtime::tokenizer(&runtime::open(m)?)?;
    let ids = tok.encode(text, parse_special)?;
    println!("{}", serde_json::to_string(&ids).map_err(ToolError::json("serialising the token ids"))?);
    Ok(())
}

/// Accepts a JSON array (`[1, 2]`) or ids separated by spaces or commas.
pub fn parse_ids(args: &[String]) -> Result<Vec<u32>, ToolError> {
    let joined = args.join(" ");
    let trimmed = joined.trim();
    if trimmed.starts_with('[') {
        return serde_json::from_str(trimmed)
            .map_err(ToolError::json("token ids must be a JSON array of non-negative integers"));
    }
    let ids = trimmed
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u32>().map_err(|source| ToolError::TokenId { text: s.to_string(), source }))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ids)
}

pub fn detokenize(m: &ModelArgs, args: &[String]) -> Result<(), ToolError> {
    let ids = parse_ids(args)?;
    if ids.is_empty() {
        return Err(ToolError::Usage("no token ids given".into()));
    }
    let tok = runtime::tokenizer(&runtime::open(m)?)?;
    let bytes = tok.decode_bytes(&ids)?;
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(&bytes).and_then(|()| out.write_all(b"\n")).map_err(ToolError::Stdout)?;
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
