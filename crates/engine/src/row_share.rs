//! How a step's decode rows are shared among tenants.
//!
//! Every decoding sequence used to get a row in every step. A step's time grows with its rows,
//! so a tenant at its full limits (8 sequences by default) made every step several times longer
//! for a tenant with one: on a 2-core machine a lone stream's inter-token latency went from
//! 4 ms to 11 ms beside it. A tenant's compute is bounded by its own limits, not by how many
//! sequences the others run.
//!
//! The rule: while two or more tenants decode, a step holds at most as many rows as keep it
//! within [`TARGET_SLOWDOWN`] times a step of the lightest tenant's rows alone, given the step's
//! measured fixed part (what every step pays: reading the weights, starting the threads) and
//! a row's measured cost ([`crate::pacing::StepClock::fixed_in_rows`]). The rows are shared
//! max-min fairly: the largest per-tenant cap under that budget, every tenant at least one
//! row. A tenant under the cap runs every row every step; a tenant over it runs its longest-
//! waiting sequences, so each of its sequences advances in turn. Nothing is shared while one
//! tenant decodes, or before the clock has measured steps of different sizes.
//!
//! What it costs: the heavy tenant's sequences advance less often while others decode (its
//! own throughput drops by about the rows it cedes), and the machine runs smaller steps. Outputs
//! do not change: a sequence's tokens do not depend on which step it runs in.

/// How much longer than the lightest tenant's own step a shared step may take: the promise is
/// 2x its inter-token latency alone; the step costs are measured and noisy, so the rule aims
/// below it.
const TARGET_SLOWDOWN: f64 = 1.75;

/// The most rows a tenant may run in one step: `None` when every row runs.
///
/// `rows` holds each decoding tenant's decode rows (zeros are ignored); `fixed_in_rows` is the
/// fixed part of a step in rows.
pub(crate) fn tenant_row_cap(rows: &[usize], fixed_in_rows: Option<f64>) -> Option<usize> {
    let fixed_in_rows = fixed_in_rows?;
    let live = rows.iter().copied().filter(|&r| r > 0);
    let tenants = live.clone().count();
    if tenants < 2 {
        return None;
    }
    let lightest = live.clone().min().unwrap_or(0);
    let total: usize = live.clone().sum();
    // fixed + budget·row ≤ k·(fixed + lightest·row)
    let k = TARGET_SLOWDOWN;
    let budget = (((k - 1.0) * fixed_in_rows + k * lightest as f64).floor() as usize).max(tenants);
    if total <= budget {
        return None;
    }
    let fits = |cap: usize| live.clone().map(|r| r.min(cap)).sum::<usize>() <= budget;
    // The cap is at least 1 (tenants ≤ budget) and below the heaviest tenant's rows.
    let mut cap = 1;
    while fits(cap + 1) {
        cap += 1;
    }
    Some(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lone_row_beside_eight_gets_its_row_and_the_eight_share_the_rest_of_the_budget() {
        // Fixed part worth 3.5 rows: a step of 1 row costs 4.5 rows' time, so a step may hold
        // 4 rows (3.5 + 4 ≤ 1.75 · 4.5 < 3.5 + 5).
        assert_eq!(tenant_row_cap(&[1, 8], Some(3.5)), Some(3));
        assert_eq!(tenant_row_cap(&[8, 0, 1], Some(3.5)), Some(3), "order and idle tenants do not matter");
    }

    #[test]
    fn nothing_is_capped_for_one_tenant_within_the_budget_or_before_the_clock_has_measured() {
        assert_eq!(tenant_row_cap(&[64], Some(0.5)), None, "one tenant: every row");
        assert_eq!(tenant_row_cap(&[64, 0], Some(0.5)), None);
        assert_eq!(tenant_row_cap(&[2, 3], Some(3.5)), None, "5 rows within 7.5");
        assert_eq!(tenant_row_cap(&[1, 8], None), None, "unmeasured");
    }

    #[test]
    fn a_heavy_model_whose_fixed_part_dwarfs_a_row_caps_nobody() {
        // Reading 8 B parameters costs what hundreds of rows' arithmetic does.
        assert_eq!(tenant_row_cap(&[1, 8, 8, 8], Some(200.0)), None);
    }

    #[test]
    fn many_light_tenants_each_keep_a_row_and_the_heavy_one_is_held_to_the_fair_cap() {
        assert_eq!(tenant_row_cap(&[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 8], Some(3.5)), Some(1));
        assert_eq!(tenant_row_cap(&[2, 2, 8, 16], Some(6.0)), Some(2), "2 + 2 + 2 + 2 ≤ 8 < 2 + 2 + 3 + 3");
        assert_eq!(tenant_row_cap(&[2, 2, 8, 16], Some(0.0)), Some(1), "never below a row per tenant");
        assert_eq!(tenant_row_cap(&[3, 8, 8], Some(4.0)), Some(2), "2 + 2 + 2 ≤ 8 < 3 + 3 + 3");
    }
}
