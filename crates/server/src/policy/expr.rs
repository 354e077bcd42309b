//! A rule's `when`: a boolean expression over named checks, in Kleene's
//! three-valued logic, so that a check that cannot answer (a timeout, an
//! unreachable system of record) is neither true nor false.

use serde::Serialize;

/// A check's answer, or an expression's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Truth {
    True,
    False,
    Undecided,
}

impl Truth {
    pub fn from_bool(b: bool) -> Self {
        if b { Truth::True } else { Truth::False }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Truth::True => "true",
            Truth::False => "false",
            Truth::Undecided => "undecided",
        }
    }
}

impl std::ops::Not for Truth {
    type Output = Truth;
    fn not(self) -> Truth {
        match self {
            Truth::True => Truth::False,
            Truth::False => Truth::True,
            Truth::Undecided => Truth::Undecided,
        }
    }
}

/// A condition, its leaves naming checks (`C` is a name when parsed, an
/// index once the policy is built).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expr<C> {
    Check(C),
    Not(Box<Expr<C>>),
    And(Box<Expr<C>>, Box<Expr<C>>),
    Or(Box<Expr<C>>, Box<Expr<C>>),
}

impl<C> Expr<C> {
    /// Every leaf, left to right.
    pub fn leaves(&self) -> Vec<&C> {
        let mut out = Vec::new();
        let mut stack = vec![self];
        while let Some(e) = stack.pop() {
            match e {
                Expr::Check(c) => out.push(c),
                Expr::Not(a) => stack.push(a),
                Expr::And(a, b) | Expr::Or(a, b) => {
                    stack.push(b);
                    stack.push(a);
                }
            }
        }
        out
    }

    /// The same expression over other leaves, each leaf told whether it
    /// counts positively (under an even number of `not`s) toward the
    /// expression's value.
    pub fn map_polar<D, E>(
        &self,
        positive: bool,
        f: &mut impl FnMut(&C, bool) -> Result<D, E>,
    ) -> Result<Expr<D>, E> {
        Ok(match self {
            Expr::Check(c) => Expr::Check(f(c, positive)?),
            Expr::Not(a) => Expr::Not(Box::new(a.map_polar(!positive, f)?)),
            Expr::And(a, b) => Expr::And(
                Box::new(a.map_polar(positive, f)?),
                Box::new(b.map_polar(positive, f)?),
            ),
            Expr::Or(a, b) => Expr::Or(
                Box::new(a.map_polar(positive, f)?),
                Box::new(b.map_polar(positive, f)?),
            ),
        })
    }

    /// The value with the checks answered so far, left to right and
    /// short-circuiting as Kleene's logic allows (`false and x` is false
    /// whatever `x` is, `true or x` true): `Err(c)` names the first check
    /// still needed.
    pub fn eval<'a>(&'a self, known: &impl Fn(&C) -> Option<Truth>) -> Result<Truth, &'a C> {
        match self {
            Expr::Check(c) => known(c).ok_or(c),
            Expr::Not(a) => Ok(!a.eval(known)?),
            Expr::And(a, b) => match a.eval(known)? {
                Truth::False => Ok(Truth::False),
                left => Ok(match (left, b.eval(known)?) {
                    (_, Truth::False) => Truth::False,
                    (Truth::True, Truth::True) => Truth::True,
                    _ => Truth::Undecided,
                }),
            },
            Expr::Or(a, b) => match a.eval(known)? {
                Truth::True => Ok(Truth::True),
                left => Ok(match (left, b.eval(known)?) {
                    (_, Truth::True) => Truth::True,
                    (Truth::False, Truth::False) => Truth::False,
                    _ => Truth::Undecided,
                }),
            },
        }
    }
}

/// The longest condition accepted, in bytes (it is the operator's, but
/// the parser recurses).
const MAX_LEN: usize = 4096;
const MAX_DEPTH: usize = 64;

/// Parses `a and not (b or c)`: `not` binds tightest, then `and`, then
/// `or`; check names are letters, digits, `_` and `-`.
pub fn parse(text: &str) -> Result<Expr<String>, String> {
    if text.len() > MAX_LEN {
        return Err(format!("longer than {MAX_LEN} characters"));
    }
    let tokens = tokenize(text)?;
    if tokens.is_empty() {
        return Err("empty; write check names joined by and, or, not".into());
    }
    let mut p = Parser {
        tokens,
        at: 0,
        depth: 0,
    };
    let e = p.or()?;
    match p.tokens.get(p.at) {
        None => Ok(e),
        Some(t) => Err(format!(
            "unexpected {} after a complete condition",
            t.show()
        )),
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Name(String),
    And,
    Or,
    Not,
    Open,
    Close,
}

impl Token {
    fn show(&self) -> String {
        match self {
            Token::Name(n) => format!("{n:?}"),
            Token::And => "\"and\"".into(),
            Token::Or => "\"or\"".into(),
            Token::Not => "\"not\"".into(),
            Token::Open => "\"(\"".into(),
            Token::Close => "\")\"".into(),
        }
    }
}

fn tokenize(text: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            c if c.is_whitespace() => {}
            '(' => out.push(Token::Open),
            ')' => out.push(Token::Close),
            c if c.is_ascii_alphanumeric() || c == '_' || c == '-' => {
                let mut end = i + c.len_utf8();
                while let Some(&(j, d)) = chars.peek() {
                    if d.is_ascii_alphanumeric() || d == '_' || d == '-' {
                        end = j + d.len_utf8();
                        chars.next();
                    } else {
                        break;
                    }
                }
                out.push(match &text[i..end] {
                    "and" => Token::And,
                    "or" => Token::Or,
                    "not" => Token::Not,
                    name => Token::Name(name.to_owned()),
                });
            }
            other => {
                return Err(format!(
                    "{other:?} at character {} is not part of a condition; write check names, and, or, not and parentheses",
                    i + 1
                ));
            }
        }
    }
    Ok(out)
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
    depth: usize,
}

impl Parser {
    fn next_is(&self, t: &Token) -> bool {
        self.tokens.get(self.at) == Some(t)
    }

    fn or(&mut self) -> Result<Expr<String>, String> {
        let mut left = self.and()?;
        while self.next_is(&Token::Or) {
            self.at += 1;
            left = Expr::Or(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr<String>, String> {
        let mut left = self.unary()?;
        while self.next_is(&Token::And) {
            self.at += 1;
            left = Expr::And(Box::new(left), Box::new(self.unary()?));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Expr<String>, String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(format!("nested deeper than {MAX_DEPTH}"));
        }
        let token = self.tokens.get(self.at).cloned();
        self.at += 1;
        let e = match token {
            Some(Token::Not) => Expr::Not(Box::new(self.unary()?)),
            Some(Token::Open) => {
                let inner = self.or()?;
                if !self.next_is(&Token::Close) {
                    return Err("a \"(\" is not closed".into());
                }
                self.at += 1;
                inner
            }
            Some(Token::Name(n)) => Expr::Check(n),
            Some(t) => return Err(format!("{} where a check name was expected", t.show())),
            None => return Err("it ends where a check name was expected".into()),
        };
        self.depth -= 1;
        Ok(e)
    }
}

#[cfg(test)]
mod tests {
    use super::Truth::{False as F, True as T, Undecided as U};
    use super::*;

    fn value(text: &str, a: Truth, b: Truth) -> Truth {
        let e = parse(text).unwrap();
        e.eval(&|c: &String| match c.as_str() {
            "a" => Some(a),
            "b" => Some(b),
            _ => None,
        })
        .unwrap()
    }

    #[test]
    fn and_or_and_not_follow_kleenes_truth_tables() {
        // (a, b, a and b, a or b)
        let table = [
            (T, T, T, T),
            (T, F, F, T),
            (T, U, U, T),
            (F, T, F, T),
            (F, F, F, F),
            (F, U, F, U),
            (U, T, U, T),
            (U, F, F, U),
            (U, U, U, U),
        ];
        for (a, b, and, or) in table {
            assert_eq!(value("a and b", a, b), and, "{a:?} and {b:?}");
            assert_eq!(value("a or b", a, b), or, "{a:?} or {b:?}");
        }
        for (a, not) in [(T, F), (F, T), (U, U)] {
            assert_eq!(value("not a", a, T), not, "not {a:?}");
        }
    }

    #[test]
    fn a_decided_left_side_does_not_ask_for_the_right() {
        let e = parse("a and b").unwrap();
        let only_a = |c: &String| (c == "a").then_some(F);
        assert_eq!(e.eval(&only_a), Ok(F));
        let e = parse("a or b").unwrap();
        let only_a = |c: &String| (c == "a").then_some(T);
        assert_eq!(e.eval(&only_a), Ok(T));
        // Undecided on the left: the right may still decide.
        let only_a = |c: &String| (c == "a").then_some(U);
        assert_eq!(e.eval(&only_a), Err(&"b".to_owned()));
    }

    #[test]
    fn not_binds_tighter_than_and_which_binds_tighter_than_or() {
        let name = |n: &str| Box::new(Expr::Check(n.to_owned()));
        assert_eq!(
            parse("a or not b and c").unwrap(),
            Expr::Or(
                name("a"),
                Box::new(Expr::And(Box::new(Expr::Not(name("b"))), name("c")))
            )
        );
        assert_eq!(
            parse("(a or b) and c").unwrap(),
            Expr::And(Box::new(Expr::Or(name("a"), name("b"))), name("c"))
        );
        assert_eq!(
            parse("not not lab-net_2").unwrap(),
            Expr::Not(Box::new(Expr::Not(name("lab-net_2"))))
        );
    }

    #[test]
    fn malformed_conditions_are_refused_with_what_went_wrong() {
        for (text, says) in [
            ("", "empty"),
            ("a and", "ends where a check name was expected"),
            ("(a or b", "not closed"),
            ("a b", "unexpected \"b\""),
            ("a && b", "'&'"),
            ("and a", "\"and\" where a check name"),
            ("a or )", "\")\" where a check name"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(says), "{text:?}: {e}");
        }
        let deep = format!("{}a{}", "(".repeat(100), ")".repeat(100));
        assert!(parse(&deep).unwrap_err().contains("nested deeper"));
    }
}
