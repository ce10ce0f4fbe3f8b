//! The dates templates print: `strftime_now(format)` and llama.cpp's `date_string` and
//! `datetime`, from the instant a [`crate::Conversation`] carries, in UTC (llama.cpp formats its
//! clock in local time; a server with TZ=UTC, as the references were made, prints the same).

use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];

/// A UTC calendar instant, broken down as C's `struct tm`.
struct Tm {
    year: i64,
    /// 1..=12
    month: usize,
    /// 1..=31
    day: i64,
    /// 0 = Sunday
    weekday: usize,
    /// 1..=366
    yday: i64,
    hour: i64,
    minute: i64,
    second: i64,
}

/// Seconds since the Unix epoch (negative before it).
fn epoch_seconds(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

/// Howard Hinnant's days-to-civil: the proleptic Gregorian date of a day number.
fn civil(days: i64) -> (i64, usize, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, usize::try_from(month).unwrap_or(1), day)
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn tm(t: SystemTime) -> Tm {
    let secs = epoch_seconds(t);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (year, month, day) = civil(days);
    const BEFORE: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let leap_day = i64::from(month > 2 && is_leap(year));
    Tm {
        year,
        month,
        day,
        // 1970-01-01 was a Thursday.
        weekday: usize::try_from((days + 4).rem_euclid(7)).unwrap_or(0),
        yday: BEFORE.get(month - 1).copied().unwrap_or(0) + day + leap_day,
        hour: rem / 3600,
        minute: rem % 3600 / 60,
        second: rem % 60,
    }
}

/// C `strftime` (glibc, "C" locale) for the directives chat templates use; `%-d` style
/// unpadded numbers as glibc allows. An unknown directive is copied through.
pub(crate) fn strftime(t: SystemTime, format: &str) -> String {
    let tm = tm(t);
    let month = MONTHS.get(tm.month - 1).copied().unwrap_or("");
    let weekday = DAYS.get(tm.weekday).copied().unwrap_or("");
    let hour12 = if tm.hour % 12 == 0 { 12 } else { tm.hour % 12 };
    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let unpadded = chars.next_if_eq(&'-').is_some();
        let num = |n: i64, width: usize| if unpadded { n.to_string() } else { format!("{n:0width$}") };
        match chars.next() {
            Some('Y') => out += &tm.year.to_string(),
            Some('y') => out += &num(tm.year.rem_euclid(100), 2),
            Some('m') => out += &num(i64::try_from(tm.month).unwrap_or(0), 2),
            Some('d') => out += &num(tm.day, 2),
            Some('e') => out += &if unpadded { tm.day.to_string() } else { format!("{:2}", tm.day) },
            Some('j') => out += &num(tm.yday, 3),
            Some('H') => out += &num(tm.hour, 2),
            Some('I') => out += &num(hour12, 2),
            Some('M') => out += &num(tm.minute, 2),
            Some('S') => out += &num(tm.second, 2),
            Some('p') => out += if tm.hour < 12 { "AM" } else { "PM" },
            Some('B') => out += month,
            Some('b') | Some('h') => out += month.get(..3).unwrap_or(month),
            Some('A') => out += weekday,
            Some('a') => out += weekday.get(..3).unwrap_or(weekday),
            Some('F') => out += &format!("{}-{:02}-{:02}", tm.year, tm.month, tm.day),
            Some('T') => out += &format!("{:02}:{:02}:{:02}", tm.hour, tm.minute, tm.second),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_like_glibc_in_utc() {
        // 2025-03-14T12:00:00Z, a Friday, the 73rd day of the year.
        let t = UNIX_EPOCH + Duration::from_secs(1_741_953_600);
        assert_eq!(strftime(t, "%d %b %Y"), "14 Mar 2025");
        assert_eq!(strftime(t, "%B %d, %Y"), "March 14, 2025");
        assert_eq!(
            strftime(t, "%A %a %j %H:%M:%S %I%p %y %F %-d %e %%"),
            "Friday Fri 073 12:00:00 12PM 25 2025-03-14 14 14 %"
        );
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(strftime(leap, "%Y-%m-%d %j %a"), "2000-02-29 060 Tue");
        assert_eq!(strftime(UNIX_EPOCH, "%d %b %Y %A"), "01 Jan 1970 Thursday");
    }
}
