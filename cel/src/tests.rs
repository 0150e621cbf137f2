//! Tests of CEL compilation, evaluation and cost, table by table.

use serde_json::json;

use super::*;

fn env() -> Env {
    Env::new()
        .var("claims", Type::map(Type::String, Type::Dyn))
        .var("user", Type::map(Type::String, Type::Dyn))
        .var("request", Type::map(Type::String, Type::Dyn))
        .var("xs", Type::list(Type::Int))
        .var("s", Type::String)
        .var("d", Type::Dyn)
}

fn vars() -> Activation {
    Activation::new()
        .bind(
            "claims",
            json!({
                "sub": "alice", "email": "alice@example.com", "email_verified": true,
                "aud": ["b", "a"], "groups": ["dev", "ops"], "n": 3, "f": 1.5,
                "nested": {"k": "v"}
            }),
        )
        .bind("user", json!({"username": "system:admin", "groups": ["system:masters"], "uid": "1"}))
        .bind(
            "request",
            json!({"user": "bob", "resourceAttributes": {"namespace": "kube-system", "verb": "get"}}),
        )
        .bind("xs", json!([1, 2, 3]))
        .bind("s", "hello world")
        .bind("d", json!({"a": 1}))
}

fn eval(expr: &str) -> Result<Value, String> {
    let p = compile(expr, &env()).map_err(|e| format!("compile: {e}"))?;
    p.eval(&vars(), DEFAULT_BUDGET)
        .map_err(|e| format!("eval: {e}"))
}

/// Each expression evaluates to the JSON value given.
fn check_values(cases: &[(&str, serde_json::Value)]) {
    for (expr, want) in cases {
        match eval(expr) {
            Ok(v) => assert_eq!(v.to_json(), *want, "{expr}"),
            Err(e) => panic!("{expr}: {e}"),
        }
    }
}

/// Each expression fails, with an error containing the text given.
fn check_errors(cases: &[(&str, &str)]) {
    for (expr, want) in cases {
        match eval(expr) {
            Ok(v) => panic!("{expr}: expected an error containing {want:?}, got {v}"),
            Err(e) => assert!(e.contains(want), "{expr}: {e:?} does not contain {want:?}"),
        }
    }
}

#[test]
fn arithmetic() {
    check_values(&[
        ("1 + 2 * 3", json!(7)),
        ("(1 + 2) * 3", json!(9)),
        ("7 / 2", json!(3)),
        ("-7 % 3", json!(-1)),
        ("3u + 4u", json!(7)),
        ("1.5 * 2.0", json!(3.0)),
        ("-(3)", json!(-3)),
        ("'ab' + 'cd'", json!("abcd")),
        ("[1] + [2, 3]", json!([1, 2, 3])),
        ("claims.n + 1", json!(4)),
        ("claims.f + 1.0", json!(2.5)),
        ("9223372036854775807 - 1", json!(9223372036854775806i64)),
        (
            "duration('1h') + duration('30m') == duration('90m')",
            json!(true),
        ),
        ("string(duration('90s'))", json!("90s")),
        (
            "timestamp('2024-01-01T00:00:00Z') + duration('24h') == timestamp('2024-01-02T00:00:00Z')",
            json!(true),
        ),
        (
            "timestamp('2024-01-02T00:00:00Z') - timestamp('2024-01-01T00:00:00Z') == duration('24h')",
            json!(true),
        ),
    ]);
}

#[test]
fn comparison_and_equality() {
    check_values(&[
        ("1 < 2", json!(true)),
        ("2 <= 2", json!(true)),
        ("'a' < 'b'", json!(true)),
        ("1 == 1.0", json!(true)),
        ("1u == 1", json!(true)),
        ("1 < 1.5", json!(true)),
        ("[1, 2] == [1, 2]", json!(true)),
        ("{'a': 1} == {'a': 1}", json!(true)),
        ("{'a': 1} != {'a': 2}", json!(true)),
        ("null == null", json!(true)),
        ("claims.sub == 'alice'", json!(true)),
        ("d == 1", json!(false)),
        ("2 in xs", json!(true)),
        ("5 in xs", json!(false)),
        ("'sub' in claims", json!(true)),
        ("type(1) == int", json!(true)),
        ("type('a') == string", json!(true)),
    ]);
}

#[test]
fn logic_absorbs_errors_as_cel_requires() {
    check_values(&[
        ("true && false", json!(false)),
        ("true || false", json!(true)),
        ("!true", json!(false)),
        // The absorbing value wins over an error on either side.
        ("false && claims.missing", json!(false)),
        ("claims.missing && false", json!(false)),
        ("true || claims.missing", json!(true)),
        ("claims.missing || true", json!(true)),
        ("1 / 0 == 1 || true", json!(true)),
        ("true ? 'y' : 'n'", json!("y")),
        ("false ? 1 : 2", json!(2)),
        ("true ? 1 : claims.missing", json!(1)),
    ]);
    check_errors(&[
        ("true && claims.missing", "no such key: missing"),
        ("claims.missing || false", "no such key: missing"),
        ("claims.sub && true", "no such overload"),
        ("!claims.sub", "no such overload"),
    ]);
}

#[test]
fn macros() {
    check_values(&[
        ("xs.all(x, x > 0)", json!(true)),
        ("xs.all(x, x > 1)", json!(false)),
        ("xs.exists(x, x == 2)", json!(true)),
        ("xs.exists(x, x == 9)", json!(false)),
        ("xs.exists_one(x, x > 2)", json!(true)),
        ("xs.exists_one(x, x > 1)", json!(false)),
        ("xs.map(x, x * 2)", json!([2, 4, 6])),
        ("xs.map(x, x > 1, x * 10)", json!([20, 30])),
        ("xs.filter(x, x % 2 == 1)", json!([1, 3])),
        (
            "claims.groups.map(g, 'oidc:' + g)",
            json!(["oidc:dev", "oidc:ops"]),
        ),
        ("claims.nested.all(k, k == 'k')", json!(true)),
        (
            "[[1, 2], [3]].map(l, l.map(x, x + 1))",
            json!([[2, 3], [4]]),
        ),
        // exists absorbs an error once some element satisfies the predicate.
        ("[0, 1].exists(x, 1 / x == 1)", json!(true)),
        ("[].all(x, x > 0)", json!(true)),
    ]);
    check_errors(&[("[0, 1].all(x, 1 / x == 1)", "division by zero")]);
}

#[test]
fn strings() {
    check_values(&[
        ("s.contains('lo w')", json!(true)),
        ("s.startsWith('hello')", json!(true)),
        ("s.endsWith('world')", json!(true)),
        ("s.matches('^h.*d$')", json!(true)),
        ("matches(s, 'x+')", json!(false)),
        ("s.matches(claims.sub)", json!(false)),
        ("'ABc'.lowerAscii()", json!("abc")),
        ("'abC'.upperAscii()", json!("ABC")),
        ("'  x '.trim()", json!("x")),
        ("'a,b,c'.split(',')", json!(["a", "b", "c"])),
        ("'a,b,c'.split(',', 2)", json!(["a", "b,c"])),
        ("['a', 'b'].join('-')", json!("a-b")),
        ("['a', 'b'].join()", json!("ab")),
        ("'aXbX'.replace('X', 'y')", json!("ayby")),
        ("'aXbX'.replace('X', 'y', 1)", json!("aybX")),
        ("s.indexOf('o')", json!(4)),
        ("s.lastIndexOf('o')", json!(7)),
        ("s.indexOf('z')", json!(-1)),
        ("s.substring(6)", json!("world")),
        ("s.substring(0, 5)", json!("hello")),
        ("size(s)", json!(11)),
        ("s.size()", json!(11)),
        ("size('héllo')", json!(5)),
        ("size(xs)", json!(3)),
        ("size(claims)", json!(8)),
        ("r'a\\b'", json!("a\\b")),
        ("'''multi\nline'''", json!("multi\nline")),
        ("string(b'abc')", json!("abc")),
        ("size(b'abc')", json!(3)),
    ]);
    check_errors(&[
        ("s.substring(20)", "out of range"),
        ("s.matches(s + '(')", "invalid regular expression"),
    ]);
}

#[test]
fn conversions() {
    check_values(&[
        ("int('42')", json!(42)),
        ("int(3.9)", json!(3)),
        ("int(-9223372036854775808.0)", json!(i64::MIN)),
        ("uint(3)", json!(3)),
        ("double(2)", json!(2.0)),
        ("string(12)", json!("12")),
        ("bool('true')", json!(true)),
        ("dyn(1) + 2", json!(3)),
        ("int(timestamp('1970-01-01T00:01:00Z'))", json!(60)),
        (
            "string(timestamp('2024-01-01T00:00:00Z'))",
            json!("2024-01-01T00:00:00Z"),
        ),
    ]);
    check_errors(&[
        ("int('x')", "cannot convert"),
        ("uint(-1)", "range error"),
        ("int(1e30)", "range error"),
        ("duration('1x')", "invalid duration"),
        ("timestamp('yesterday')", "invalid timestamp"),
    ]);
}

#[test]
fn sets() {
    check_values(&[
        ("sets.equivalent(claims.aud, ['a', 'b'])", json!(true)),
        ("sets.equivalent(claims.aud, ['a'])", json!(false)),
        ("sets.contains(['a', 'b', 'c'], ['a', 'c'])", json!(true)),
        ("sets.contains(['a'], ['a', 'c'])", json!(false)),
        ("sets.intersects(claims.groups, ['ops', 'x'])", json!(true)),
        ("sets.intersects(claims.groups, ['x'])", json!(false)),
        ("sets.contains([1, 2], [1.0])", json!(true)),
    ]);
}

#[test]
fn presence_and_optionals() {
    check_values(&[
        ("has(claims.email)", json!(true)),
        ("has(claims.phone)", json!(false)),
        ("has(claims.nested.k)", json!(true)),
        ("claims.?phone.orValue('none')", json!("none")),
        ("claims.?sub.orValue('none')", json!("alice")),
        ("claims.?nested.?k.orValue('x')", json!("v")),
        ("claims.?nested.k.orValue('x')", json!("v")),
        ("claims.?phone.hasValue()", json!(false)),
        ("claims[?'sub'].value()", json!("alice")),
        ("claims['sub']", json!("alice")),
        ("xs[1]", json!(2)),
        ("{'a': {'b': 1}}.a.b", json!(1)),
        ("{1: 'one'}[1u]", json!("one")),
    ]);
}

#[test]
fn the_expressions_the_spec_names() {
    check_values(&[
        ("claims.email_verified == true", json!(true)),
        ("sets.equivalent(claims.aud, ['a','b'])", json!(true)),
        ("'system:' in user.groups", json!(false)),
        ("'system:masters' in user.groups", json!(true)),
        ("!user.username.startsWith('system:')", json!(false)),
        (
            "claims.groups.map(g, 'oidc:' + g)",
            json!(["oidc:dev", "oidc:ops"]),
        ),
        (
            "request.resourceAttributes.namespace == 'kube-system'",
            json!(true),
        ),
        (
            "claims.sub + ':' + claims.email",
            json!("alice:alice@example.com"),
        ),
    ]);
}

#[test]
fn runtime_errors() {
    check_errors(&[
        ("claims.missing == 'x'", "no such key: missing"),
        ("claims['missing']", "no such key: missing"),
        ("xs[5]", "index out of bounds"),
        ("xs[-1]", "index out of bounds"),
        ("9223372036854775807 + 1", "integer overflow"),
        ("-9223372036854775808 - 1", "integer overflow"),
        ("-(-9223372036854775808)", "integer overflow"),
        ("9223372036854775807 * 2", "integer overflow"),
        ("0u - 1u", "integer overflow"),
        ("1 / 0", "division by zero"),
        ("1 % 0", "modulus by zero"),
        ("-9223372036854775808 / -1", "integer overflow"),
        ("claims.sub.foo", "does not support field selection"),
        ("d + 1", "no such overload"),
        ("{'a': 1, 'a': 2}", "repeated key"),
        ("claims.?phone.value()", "optional.none()"),
    ]);
}

fn compile_error(expr: &str) -> String {
    match compile(expr, &env()) {
        Ok(_) => panic!("{expr}: expected a compile error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn compile_errors() {
    let cases: &[(&str, &str)] = &[
        (
            "foo",
            "compilation failed: ERROR: <input>:1:1: undeclared reference to 'foo'",
        ),
        (
            "1 + foo",
            "ERROR: <input>:1:5: undeclared reference to 'foo'",
        ),
        ("frobnicate(1)", "undeclared reference to 'frobnicate'"),
        ("s.frobnicate()", "undeclared reference to 'frobnicate'"),
        (
            "1 + 'a'",
            "found no matching overload for '+' applied to '(int, string)'",
        ),
        (
            "size(true)",
            "found no matching overload for 'size' applied to '(bool)'",
        ),
        (
            "1 && true",
            "found no matching overload for '&&' applied to 'int'",
        ),
        ("!'a'", "found no matching overload"),
        (
            "s.startsWith(1)",
            "found no matching overload for 'startsWith'",
        ),
        ("1 == 'a'", "found no matching overload for '=='"),
        ("xs.all(x, x)", "found no matching overload for '&&'"),
        ("xs.map(x, y)", "undeclared reference to 'y'"),
        ("s.matches('(')", "invalid regular expression"),
        ("s.foo", "type 'string' does not support field selection"),
        ("1 +", "ERROR: <input>:1:"),
        ("has(1)", "invalid argument to has() macro"),
        ("true ? 1 : 'a'", "no matching overload for '_?_:_'"),
        ("Foo{a: 1}", "undeclared reference to 'Foo'"),
        ("sets.unknown([1], [2])", "undeclared reference"),
    ];
    for (expr, want) in cases {
        let got = compile_error(expr);
        assert!(
            got.contains(want),
            "{expr}: {got:?} does not contain {want:?}"
        );
    }
}

#[test]
fn expect_checks_the_output_type() {
    let e = env();
    assert!(
        compile("claims.email_verified == true", &e)
            .unwrap()
            .expect(&[Type::Bool])
            .is_ok()
    );
    // A dynamic output passes and is checked at run time.
    assert!(
        compile("claims.email_verified", &e)
            .unwrap()
            .expect(&[Type::Bool])
            .is_ok()
    );
    let err = compile("'x'", &e)
        .unwrap()
        .expect(&[Type::Bool])
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("must evaluate to bool, got string"),
        "{err}"
    );
    let p = compile("claims.groups.map(g, 'oidc:' + g)", &e).unwrap();
    assert_eq!(p.output_type(), &Type::list(Type::String));
    assert!(p.expect(&[Type::String, Type::list(Type::String)]).is_ok());
    assert_eq!(
        compile("xs.filter(x, x > 1)", &e).unwrap().output_type(),
        &Type::list(Type::Int)
    );
    assert_eq!(
        compile("size(s) > 1", &e).unwrap().output_type(),
        &Type::Bool
    );
    let v = vars();
    assert_eq!(
        compile("claims.email_verified", &e)
            .unwrap()
            .eval_bool(&v, DEFAULT_BUDGET),
        Ok(true)
    );
    let err = compile("claims.sub", &e)
        .unwrap()
        .eval_bool(&v, DEFAULT_BUDGET)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "expression must evaluate to bool, got string"
    );
}

#[test]
fn limits_on_the_expression_itself() {
    let e = env();
    let deep = format!("{}1{}", "(".repeat(150), ")".repeat(150));
    let err = compile(&deep, &e).unwrap_err().to_string();
    assert!(err.contains("compilation failed"), "{err}");
    let ok = format!("{}1{}", "(".repeat(40), ")".repeat(40));
    assert_eq!(eval(&ok).unwrap().to_json(), json!(1));
    let long = format!("'{}'", "a".repeat(MAX_EXPRESSION_LENGTH));
    let err = compile(&long, &e).unwrap_err().to_string();
    assert!(err.contains("exceeds the limit"), "{err}");
    let chain = vec!["1"; 90].join(" + ");
    assert_eq!(eval(&chain).unwrap().to_json(), json!(90));
}

#[test]
fn selects_finds_field_reads_of_a_variable() {
    let e = env();
    let cases: &[(&str, bool)] = &[
        ("claims.email", true),
        ("has(claims.email)", true),
        ("claims.?email.orValue('')", true),
        ("claims['email'] == 'x'", true),
        ("claims.sub + claims.email", true),
        ("[1].map(x, claims.email)", true),
        ("claims.email_verified", false),
        ("claims.nested.email", false),
        ("'email' in claims", false),
        ("[claims].map(claims, claims.email)", false),
    ];
    for (expr, want) in cases {
        let p = compile(expr, &e).unwrap();
        assert_eq!(p.selects("claims", "email"), *want, "{expr}");
    }
}

fn cost_of(expr: &str, vars: &Activation) -> Result<u64, EvalError> {
    compile(expr, &env())
        .unwrap()
        .eval_with_cost(vars, u64::MAX)
        .map(|(_, c)| c)
}

#[test]
fn costs_follow_the_model() {
    let v = vars();
    let cases: &[(&str, u64)] = &[
        ("1", 0),
        ("1 == 1", 1),
        ("1 < 2 && 2 < 3", 3),
        // 1 for the access, a tenth of the 11 bytes of the result.
        ("s", 1 + 1),
        ("claims.sub", 2),
        ("[]", 40),
        // The literal 40, plus 1 per element of the result.
        ("[1, 2, 3]", 43),
        ("{}", 30),
        // matches: the regex's length times the input's.
        ("s.matches('^h')", 2 * 11 + 1),
        // The range 1; per iteration 1, the loop condition 1, the step 4 (`@result && x > 0`);
        // the result 1.
        ("xs.all(x, x > 0)", 1 + 3 * (1 + 1 + 4) + 1),
    ];
    for (expr, want) in cases {
        assert_eq!(cost_of(expr, &v).unwrap(), *want, "{expr}");
    }
    // A result of shared references costs its flattened size.
    let big = Activation::new().bind("s", "x".repeat(100_000));
    assert_eq!(cost_of("[s, s]", &big).unwrap(), 40 + 2 + 2 + 2 * 10_000);
    let p = compile(
        "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].map(a, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].map(b, s))",
        &env(),
    )
    .unwrap();
    assert!(matches!(
        p.eval(&big, DEFAULT_BUDGET),
        Err(EvalError::CostLimitExceeded)
    ));
    // Comparing aggregates costs per element, nested ones included.
    let nested = Activation::new().bind("d", json!([[1, 2, 3], [4, 5, 6]]));
    assert_eq!(cost_of("d == d", &nested).unwrap(), 1 + 1 + 1 + 2 + 2 * 3);
    // Cost grows with the data, not just with the expression.
    let small = Activation::new().bind("s", "x".repeat(100));
    let big = Activation::new().bind("s", "x".repeat(100_000));
    let c_small = cost_of("s.contains('y')", &small).unwrap();
    let c_big = cost_of("s.contains('y')", &big).unwrap();
    assert!(c_big >= c_small + 9_000, "{c_small} {c_big}");
}

#[test]
fn the_budget_stops_evaluation() {
    let e = env();
    let big: Vec<i64> = (0..1000).collect();
    let v = Activation::new()
        .bind("xs", big)
        .bind("s", "a".repeat(200_000));
    // A nested map over a 1000-element list is a million iterations: over the budget.
    let p = compile("xs.map(x, xs.map(y, x + y)).size() > 0", &e).unwrap();
    assert!(matches!(
        p.eval(&v, DEFAULT_BUDGET),
        Err(EvalError::CostLimitExceeded)
    ));
    assert_eq!(
        p.eval(&v, DEFAULT_BUDGET).unwrap_err().to_string(),
        "operation cancelled: actual cost limit exceeded"
    );
    // A regex over a long input: 20 × 200000 is over a million.
    let p = compile("s.matches('^(a|b)+c$')", &e).unwrap();
    assert!(matches!(
        p.eval(&v, DEFAULT_BUDGET),
        Err(EvalError::CostLimitExceeded)
    ));
    // Non-literal regexes are charged the same way.
    let p = compile("s.matches(s.substring(0, 10))", &e).unwrap();
    assert!(matches!(
        p.eval(&v, DEFAULT_BUDGET),
        Err(EvalError::CostLimitExceeded)
    ));
    // An error that would be absorbed by `||` is not when it is the budget.
    let p = compile("xs.map(x, xs.map(y, y)).size() > 0 || true", &e).unwrap();
    assert!(matches!(
        p.eval(&v, DEFAULT_BUDGET),
        Err(EvalError::CostLimitExceeded)
    ));
    // The same expression fits a larger budget.
    let p = compile("xs.map(x, x + 1).size()", &e).unwrap();
    assert!(p.eval(&v, DEFAULT_BUDGET).is_ok());
    assert!(matches!(p.eval(&v, 100), Err(EvalError::CostLimitExceeded)));
    // Exponential growth by doubling is stopped by the size caps or the budget.
    let ten = "[1,2,3,4,5,6,7,8,9,10]";
    let nested = format!(
        "{ten}.map(a, {ten}.map(b, {ten}.map(c, {ten}.map(d, {ten}.map(e, {ten}.map(f, s))))))"
    );
    let p = compile(&nested, &e).unwrap();
    assert!(matches!(
        p.eval(&v, DEFAULT_BUDGET),
        Err(EvalError::CostLimitExceeded)
    ));
}

#[test]
fn built_strings_and_lists_are_capped() {
    let e = env();
    let v = Activation::new().bind("s", "a".repeat(1 << 20));
    let p = compile("s.replace('a', 'aaaaaaaaaa')", &e).unwrap();
    let err = p.eval(&v, u64::MAX).unwrap_err();
    assert!(err.to_string().contains("exceeds the limit"), "{err}");
    let p = compile("s.split('')", &e).unwrap();
    let err = p.eval(&v, u64::MAX).unwrap_err();
    assert!(err.to_string().contains("exceeds the limit"), "{err}");
    let p = compile("s + s + s + s", &e).unwrap();
    let err = p.eval(&v, u64::MAX).unwrap_err();
    assert!(err.to_string().contains("exceeds the limit"), "{err}");
}

#[test]
fn programs_are_shared_across_threads() {
    fn send_sync<T: Send + Sync + Clone>() {}
    send_sync::<Program>();
    let p = compile("claims.sub == 'alice'", &env()).unwrap();
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let p = p.clone();
            std::thread::spawn(move || p.eval(&vars(), DEFAULT_BUDGET).unwrap().as_bool())
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), Some(true));
    }
}

#[test]
fn values_convert_from_and_to_json() {
    let j = json!({"a": [1, 2.5, "x", null, true], "b": {"c": -3}});
    let v = Value::from(j.clone());
    assert_eq!(v.to_json(), j);
    assert!(matches!(Value::from(json!(1)), Value::Int(1)));
    assert!(matches!(Value::from(json!(1.0)), Value::Double(_)));
    assert_eq!(Value::from("x").as_str(), Some("x"));
    assert_eq!(Value::Bool(true).as_bool(), Some(true));
}

mod fuzz {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn compile_never_panics_on_random_text(text in "\\PC{0,80}") {
            let _ = compile(&text, &env());
        }

        #[test]
        fn compile_and_eval_never_panic_on_cel_like_text(
            text in "[a-z0-9_.,:?!<>=+*/%&|\\-\\[\\]\\(\\)\\{\\}'\" ]{0,60}"
        ) {
            if let Ok(p) = compile(&text, &env()) {
                let _ = p.eval(&vars(), 10_000);
            }
        }

        #[test]
        fn compile_and_eval_never_panic_on_expressions_over_claims(
            parts in proptest::collection::vec(prop_oneof![
                Just("claims.sub"), Just("claims.n"), Just("claims.aud"), Just("xs"), Just("s"), Just("d"),
                Just("1"), Just("-9223372036854775808"), Just("2.5"), Just("'a'"), Just("[1, 'x']"),
                Just("{'k': 1}"), Just(" + "), Just(" - "), Just(" * "), Just(" / "), Just(" % "),
                Just(" == "), Just(" < "), Just(" && "), Just(" || "), Just(" in "), Just("!"),
                Just(".size()"), Just(".map(x, x)"), Just(".all(x, x)"), Just("["), Just("]"),
                Just("("), Just(")"), Just(".matches('a*')"), Just("int("), Just("string("),
            ], 0..12)
        ) {
            let text: String = parts.concat();
            if let Ok(p) = compile(&text, &env()) {
                let _ = p.eval(&vars(), 10_000);
            }
        }
    }
}

/// Long flat chains and deep nesting are refused or evaluated, never a stack overflow, in a
/// thread with a 2 MiB stack (a Tokio worker's).
#[test]
fn long_chains_and_deep_nesting_do_not_overflow_the_stack() {
    let cases: Vec<(String, bool)> = vec![
        (vec!["1"; 5000].join(" + "), false),
        (vec!["1"; 100].join(" + "), true),
        (vec!["1"; 102].join(" + "), false),
        // `&&` and `||` chains are balanced by the parser.
        (vec!["true"; 400].join(" && "), true),
        (format!("claims{}", ".a".repeat(5000)), false),
        (format!("xs{}", "[0]".repeat(5000)), false),
        (format!("{}true", "!".repeat(5000)), false),
        (format!("{}1", "-".repeat(5000)), false),
        (format!("{}1{}", "[".repeat(5000), "]".repeat(5000)), false),
        (format!("{}1{}", "(".repeat(99), ")".repeat(99)), true),
        (format!("{}1{}", "[".repeat(99), "]".repeat(99)), true),
        (format!("{}true", "!".repeat(99)), true),
        (format!("s{}", ".trim()".repeat(5000)), false),
        (format!("s{}", ".trim()".repeat(90)), true),
        (format!("xs{}", ".map(x, x)".repeat(200)), false),
        (format!("xs{}", ".map(x, x)".repeat(30)), true),
    ];
    let handle = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            let e = env();
            for (x, evaluates) in &cases {
                let outcome = match compile(x, &e) {
                    Ok(p) => p
                        .eval(&vars(), DEFAULT_BUDGET)
                        .map(|_| ())
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                assert_eq!(
                    outcome.is_ok(),
                    *evaluates,
                    "{}: {outcome:?}",
                    &x[..x.len().min(60)]
                );
                if let Err(msg) = outcome {
                    assert!(msg.contains("limit"), "{msg}");
                }
            }
        })
        .unwrap();
    handle
        .join()
        .expect("no stack overflow, every case as expected");
}
