//! Complex detection: conjunctive-normal-form expressions over INT metadata (the paper's
//! `complex_detection`, §III-C "Expression", after FastReact's logic tables).
//!
//! ```text
//! expression := clause ( "and" clause )*          every clause must hold
//! clause     := literal ( "or" literal )*         one literal must hold; may be in ( )
//! literal    := term op quantity
//! term       := field | max(field) | min(field) | sum(field) | delta(field) | hops
//! op         := > | >= | < | <= | == | !=
//! quantity   := integer [ns|us|ms|s]  (times in nanoseconds)  |  integer [B|KB|MB]
//! ```
//!
//! A bare `field` means its largest value on the path (`max`): `hop_latency > 10us` holds when
//! any hop took longer than 10 µs. `delta(field)` is how much the path's sum of the field grew
//! since the flow's previous packet (negative when it fell), the paper's "queue buildup".
//! Field names are INT's ([`Field::name`]). Text is parsed once at configuration; evaluation
//! walks fixed arrays and allocates nothing.

use telemark_wire::int::{Field, Hop};

/// Most literals one expression may hold.
pub const MAX_LITERALS: usize = 16;
/// Most `delta(...)` terms one expression may hold (each keeps one value per flow).
pub const MAX_DELTAS: usize = 4;

/// How a term reduces the path's values of a field to one number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Term {
    /// Largest value on the path.
    Max(Field),
    /// Smallest value on the path.
    Min(Field),
    /// Sum over the path.
    Sum(Field),
    /// Growth of the sum since the flow's previous packet; the index is its state slot.
    Delta(Field, u8),
    /// Number of hops that reported.
    Hops,
}

/// A comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `>`.
    Gt,
    /// `>=`.
    Ge,
    /// `<`.
    Lt,
    /// `<=`.
    Le,
    /// `==`.
    Eq,
    /// `!=`.
    Ne,
}

impl Op {
    fn holds(self, a: i64, b: i64) -> bool {
        match self {
            Op::Gt => a > b,
            Op::Ge => a >= b,
            Op::Lt => a < b,
            Op::Le => a <= b,
            Op::Eq => a == b,
            Op::Ne => a != b,
        }
    }
}

/// `term op value`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Literal {
    /// What is measured.
    pub term: Term,
    /// How it is compared.
    pub op: Op,
    /// With what.
    pub value: i64,
}

/// A parsed expression: clauses of literals, all clauses must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expr {
    literals: [Literal; MAX_LITERALS],
    /// `clause_end[c]` is one past the last literal of clause `c`.
    clause_end: [u8; MAX_LITERALS],
    clauses: u8,
    deltas: u8,
    text: String,
}

/// Per-flow state an expression keeps: the previous sums its `delta` terms compare with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExprState {
    previous: [i64; MAX_DELTAS],
    primed: bool,
}

impl ExprState {
    /// A flow's state before its first packet.
    pub const EMPTY: ExprState = ExprState { previous: [0; MAX_DELTAS], primed: false };
}

/// Why an expression did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expression {text:?}: {why}")]
pub struct ExprError {
    text: String,
    why: String,
}

fn value_of(hops: &[Hop], term: Term) -> Option<i64> {
    let field = match term {
        Term::Hops => return Some(hops.len() as i64),
        Term::Max(f) | Term::Min(f) | Term::Sum(f) | Term::Delta(f, _) => f,
    };
    // Values a hop marked unavailable (all ones) take no part; the rest fit i64 saturated.
    let values = hops
        .iter()
        .filter_map(|h| h.available(field))
        .map(|v| i64::try_from(v).unwrap_or(i64::MAX));
    match term {
        Term::Max(_) => values.max(),
        Term::Min(_) => values.min(),
        _ => Some(values.fold(0i64, i64::saturating_add)),
    }
}

impl Expr {
    /// The fields the expression reads.
    pub fn fields(&self) -> impl Iterator<Item = Field> + '_ {
        self.literals[..usize::from(self.clause_end[usize::from(self.clauses).saturating_sub(1)])]
            .iter()
            .filter_map(|l| match l.term {
                Term::Max(f) | Term::Min(f) | Term::Sum(f) | Term::Delta(f, _) => Some(f),
                Term::Hops => None,
            })
    }

    /// Parses `text`.
    pub fn parse(text: &str) -> Result<Expr, ExprError> {
        let err = |why: String| ExprError { text: text.to_string(), why };
        let no_literal = Literal { term: Term::Hops, op: Op::Eq, value: 0 };
        let mut e = Expr {
            literals: [no_literal; MAX_LITERALS],
            clause_end: [0; MAX_LITERALS],
            clauses: 0,
            deltas: 0,
            text: text.trim().to_string(),
        };
        let mut n = 0usize;
        for clause in split_word(text, "and") {
            let clause = clause.trim();
            let clause = strip_parens(clause);
            for lit in split_word(clause, "or") {
                if n == MAX_LITERALS {
                    return Err(err(format!("more than {MAX_LITERALS} comparisons")));
                }
                e.literals[n] = e.parse_literal(strip_parens(lit.trim())).map_err(err)?;
                n += 1;
            }
            e.clause_end[usize::from(e.clauses)] = n as u8;
            e.clauses += 1;
        }
        Ok(e)
    }

    fn parse_literal(&mut self, s: &str) -> Result<Literal, String> {
        if s.is_empty() {
            return Err("an empty comparison (two operators in a row, or a stray and/or)".into());
        }
        let ops = [
            (">=", Op::Ge),
            ("<=", Op::Le),
            ("==", Op::Eq),
            ("!=", Op::Ne),
            (">", Op::Gt),
            ("<", Op::Lt),
        ];
        let Some((at, sym, op)) =
            ops.iter().find_map(|(sym, op)| s.find(sym).map(|at| (at, *sym, *op)))
        else {
            return Err(format!("{s:?} has no comparison (>, >=, <, <=, ==, !=)"));
        };
        let term = self.parse_term(s[..at].trim())?;
        let value = parse_quantity(s[at + sym.len()..].trim())?;
        Ok(Literal { term, op, value })
    }

    fn parse_term(&mut self, s: &str) -> Result<Term, String> {
        if s == "hops" {
            return Ok(Term::Hops);
        }
        let (func, name) = match s.split_once('(') {
            Some((f, rest)) => {
                let Some(name) = rest.trim().strip_suffix(')') else {
                    return Err(format!("{s:?}: missing )"));
                };
                (f.trim(), name.trim())
            }
            None => ("max", s),
        };
        let field = Field::from_name(name).ok_or_else(|| {
            let names: Vec<&str> = Field::ALL.iter().map(|f| f.name()).collect();
            format!("unknown field {name:?}; fields are {}", names.join(", "))
        })?;
        Ok(match func {
            "max" => Term::Max(field),
            "min" => Term::Min(field),
            "sum" => Term::Sum(field),
            "delta" => {
                if usize::from(self.deltas) == MAX_DELTAS {
                    return Err(format!("more than {MAX_DELTAS} delta() terms"));
                }
                self.deltas += 1;
                Term::Delta(field, self.deltas - 1)
            }
            other => return Err(format!("unknown function {other:?} (max, min, sum, delta)")),
        })
    }

    /// The expression as configured.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The literals of each clause.
    pub fn clauses(&self) -> impl Iterator<Item = &[Literal]> {
        (0..usize::from(self.clauses)).map(|c| {
            let start = if c == 0 { 0 } else { usize::from(self.clause_end[c - 1]) };
            &self.literals[start..usize::from(self.clause_end[c])]
        })
    }

    /// Evaluates the expression on one packet's hops and updates the flow's state. A `delta`
    /// term is false on a flow's first packet (there is nothing to compare with).
    pub fn eval(&self, hops: &[Hop], state: &mut ExprState) -> bool {
        let mut current = [0i64; MAX_DELTAS];
        for lit in
            &self.literals[..usize::from(self.clause_end[usize::from(self.clauses.max(1)) - 1])]
        {
            if let Term::Delta(f, slot) = lit.term {
                current[usize::from(slot)] = value_of(hops, Term::Sum(f)).unwrap_or(0);
            }
        }
        let holds = |lit: &Literal| match lit.term {
            Term::Delta(_, slot) => {
                state.primed
                    && lit.op.holds(
                        current[usize::from(slot)]
                            .saturating_sub(state.previous[usize::from(slot)]),
                        lit.value,
                    )
            }
            term => value_of(hops, term).is_some_and(|v| lit.op.holds(v, lit.value)),
        };
        let fired = self.clauses().all(|clause| clause.iter().any(holds));
        state.previous = current;
        state.primed = true;
        fired
    }
}

/// `s` without one pair of parentheses around all of it (`(a) or (b)` keeps its own).
fn strip_parens(s: &str) -> &str {
    let Some(inner) = s.strip_prefix('(').and_then(|c| c.strip_suffix(')')) else { return s };
    let mut depth = 0i32;
    for b in inner.bytes() {
        depth += match b {
            b'(' => 1,
            b')' => -1,
            _ => 0,
        };
        if depth < 0 {
            // The first `(` closed before the end: the parentheses are not around it all.
            return s;
        }
    }
    inner
}

/// Splits `s` on the whole word `word` (case-insensitive), outside parentheses.
fn split_word<'a>(s: &'a str, word: &str) -> impl Iterator<Item = &'a str> {
    let mut parts = Vec::new();
    let bytes = s.as_bytes();
    let (mut depth, mut start, mut i) = (0i32, 0usize, 0usize);
    while i < bytes.len() {
        match bytes[i] {
            b'(' => depth += 1,
            b')' => depth -= 1,
            _ => {}
        }
        // Bytes, not `str` slices: the text may hold any UTF-8, and `word` is ASCII.
        let at_word = depth == 0
            && bytes
                .get(i..i + word.len())
                .is_some_and(|w| w.eq_ignore_ascii_case(word.as_bytes()))
            && (i == 0 || bytes[i - 1].is_ascii_whitespace())
            && bytes.get(i + word.len()).is_none_or(|b| b.is_ascii_whitespace() || *b == b'(');
        if at_word {
            parts.push(&s[start..i]);
            i += word.len();
            start = i;
            continue;
        }
        i += 1;
    }
    parts.push(&s[start..]);
    parts.into_iter()
}

/// Parses a threshold: an integer, a time (`ns`, `us`, `ms`, `s`; in nanoseconds) or a size
/// (`B`, `KB`, `MB` in powers of 1000, `KiB`, `MiB` in powers of 1024; in bytes). Negative
/// values are allowed for `delta` comparisons.
pub fn parse_quantity(s: &str) -> Result<i64, String> {
    let s = s.trim();
    let (neg, body) = match s.strip_prefix('-') {
        Some(b) => (true, b.trim()),
        None => (false, s),
    };
    let units: [(&str, f64); 9] = [
        ("ns", 1.0),
        ("us", 1e3),
        ("ms", 1e6),
        ("KiB", 1024.0),
        ("MiB", 1048576.0),
        ("KB", 1e3),
        ("MB", 1e6),
        ("s", 1e9),
        ("B", 1.0),
    ];
    let (num, mult) = units
        .iter()
        .find_map(|(u, m)| body.strip_suffix(u).map(|n| (n.trim(), *m)))
        .unwrap_or((body, 1.0));
    match num.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 && v * mult < 9.2e18 => {
            let v = (v * mult).round() as i64;
            Ok(if neg { -v } else { v })
        }
        _ => Err(format!("{s:?} is not a number, a time (10us) or a size (100KB)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hop(latency: u64, occupancy: u64) -> Hop {
        let mut h = Hop::default();
        h.set(Field::HopLatency, latency);
        h.set(Field::QueueOccupancy, occupancy);
        h
    }

    #[test]
    fn papers_example() {
        let e = Expr::parse("hop_latency > 10us and queue_occupancy > 100").unwrap();
        let mut s = ExprState::default();
        assert!(e.eval(&[hop(20_000, 150), hop(1, 1)], &mut s));
        assert!(!e.eval(&[hop(20_000, 50)], &mut s));
        assert!(!e.eval(&[hop(5_000, 150)], &mut s));
        assert_eq!(e.clauses().count(), 2);
    }

    #[test]
    fn or_clauses_and_functions() {
        let e = Expr::parse("(min(hop_latency) >= 1ms or hops > 3) and sum(queue_occupancy) < 1KB")
            .unwrap();
        let mut s = ExprState::default();
        assert!(e.eval(&[hop(1_000_000, 10), hop(2_000_000, 10)], &mut s));
        assert!(!e.eval(&[hop(999_999, 10), hop(2_000_000, 10)], &mut s));
        let four = [hop(0, 1); 4];
        assert!(e.eval(&four, &mut s));
        assert!(!e.eval(&[hop(0, 600), hop(0, 600), hop(0, 0), hop(0, 0)], &mut s));
    }

    #[test]
    fn parentheses_only_around_a_whole_clause_are_dropped() {
        let e = Expr::parse("(hop_latency > 1) or (hops > 2)").unwrap();
        assert_eq!(e.clauses().count(), 1);
        assert_eq!(e.clauses().next().map(<[Literal]>::len), Some(2));
        let mut s = ExprState::default();
        assert!(e.eval(&[hop(0, 0); 3], &mut s));
        assert!(!e.eval(&[hop(0, 0); 2], &mut s));
    }

    #[test]
    fn delta_is_stateful() {
        let e = Expr::parse("delta(queue_occupancy) > 100").unwrap();
        let mut s = ExprState::default();
        assert!(!e.eval(&[hop(0, 500)], &mut s), "first packet has nothing to compare");
        assert!(!e.eval(&[hop(0, 550)], &mut s));
        assert!(e.eval(&[hop(0, 700)], &mut s));
        assert!(!e.eval(&[hop(0, 100)], &mut s));
        let fall = Expr::parse("delta(queue_occupancy) < -50").unwrap();
        let mut s = ExprState::default();
        fall.eval(&[hop(0, 500)], &mut s);
        assert!(fall.eval(&[hop(0, 400)], &mut s));
    }

    #[test]
    fn errors_say_what_is_wrong() {
        for (text, says) in [
            ("hop_latncy > 1", "unknown field"),
            ("hop_latency 5", "no comparison"),
            ("hop_latency > ten", "not a number"),
            ("avg(hop_latency) > 1", "unknown function"),
            ("hop_latency > 1 and", "empty comparison"),
            ("hop_latency > 10µs", "not a number"),
        ] {
            let e = Expr::parse(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
        assert_eq!(parse_quantity("1.5us"), Ok(1500));
        assert_eq!(parse_quantity("-2KB"), Ok(-2000));
        assert_eq!(parse_quantity("64KiB"), Ok(65_536));
    }
}
