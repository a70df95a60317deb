"""A small offline set of Python function problems with unit tests, written for this project.

Each is one short function (most are one line), easy enough that a 135M-parameter instruct model solves some of
them at temperature 1 and learns more with RL. ``OFFLINE_PROBLEMS[i]`` with ``i % 4 == 3`` are held out for
evaluation (``split_offline``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CodeProblem:
    name: str
    prompt: str
    """What to write, as the user message says it."""
    tests: tuple[str, ...]
    """Python assertions (``assert f(1) == 2``), each one test; or, for stdin problems, see ``io_tests``."""
    io_tests: tuple[tuple[str, str], ...] = ()
    """(stdin, expected stdout) pairs for whole-program problems (the hub sets); compared token by token."""


def _p(signature: str, does: str, *tests: str) -> CodeProblem:
    return CodeProblem(signature.split("(")[0], f"Write a Python function `{signature}` that {does}.", tests)


OFFLINE_PROBLEMS: tuple[CodeProblem, ...] = (
    _p("square(x)", "returns x squared", "assert square(3) == 9", "assert square(-2) == 4", "assert square(0) == 0"),
    _p("double(x)", "returns twice x", "assert double(4) == 8", "assert double(-1) == -2", "assert double(0) == 0"),
    _p("is_even(n)", "returns True if n is even and False otherwise", "assert is_even(4) is True",
       "assert is_even(7) is False", "assert is_even(0) is True"),
    _p("negate(x)", "returns -x", "assert negate(5) == -5", "assert negate(-3) == 3", "assert negate(0) == 0"),
    _p("max_of_two(a, b)", "returns the larger of a and b", "assert max_of_two(2, 9) == 9",
       "assert max_of_two(7, 1) == 7", "assert max_of_two(-4, -8) == -4"),
    _p("min_of_two(a, b)", "returns the smaller of a and b", "assert min_of_two(2, 9) == 2",
       "assert min_of_two(7, 1) == 1", "assert min_of_two(-4, -8) == -8"),
    _p("first(items)", "returns the first element of the list items", "assert first([4, 5, 6]) == 4",
       "assert first(['a']) == 'a'", "assert first([0, 1]) == 0"),
    _p("last(items)", "returns the last element of the list items", "assert last([4, 5, 6]) == 6",
       "assert last(['a']) == 'a'", "assert last([0, 1]) == 1"),
    _p("length(s)", "returns the number of characters in the string s", "assert length('abc') == 3",
       "assert length('') == 0", "assert length('hello world') == 11"),
    _p("to_upper(s)", "returns the string s in upper case", "assert to_upper('abc') == 'ABC'",
       "assert to_upper('Hi there') == 'HI THERE'", "assert to_upper('') == ''"),
    _p("to_lower(s)", "returns the string s in lower case", "assert to_lower('ABC') == 'abc'",
       "assert to_lower('Hi There') == 'hi there'", "assert to_lower('') == ''"),
    _p("reverse_string(s)", "returns the string s reversed", "assert reverse_string('abc') == 'cba'",
       "assert reverse_string('') == ''", "assert reverse_string('racecar') == 'racecar'"),
    _p("sum_list(nums)", "returns the sum of the numbers in the list nums", "assert sum_list([1, 2, 3]) == 6",
       "assert sum_list([]) == 0", "assert sum_list([-1, 1, 5]) == 5"),
    _p("count_items(items)", "returns how many elements the list items has", "assert count_items([1, 2, 3]) == 3",
       "assert count_items([]) == 0", "assert count_items(['x']) == 1"),
    _p("is_positive(n)", "returns True if n is greater than zero and False otherwise",
       "assert is_positive(3) is True", "assert is_positive(-2) is False", "assert is_positive(0) is False"),
    _p("abs_value(x)", "returns the absolute value of x", "assert abs_value(-7) == 7", "assert abs_value(7) == 7",
       "assert abs_value(0) == 0"),
    _p("concat(a, b)", "returns the strings a and b joined together", "assert concat('ab', 'cd') == 'abcd'",
       "assert concat('', 'x') == 'x'", "assert concat('hi', '') == 'hi'"),
    _p("increment(n)", "returns n plus one", "assert increment(1) == 2", "assert increment(-1) == 0",
       "assert increment(99) == 100"),
    _p("decrement(n)", "returns n minus one", "assert decrement(1) == 0", "assert decrement(0) == -1",
       "assert decrement(100) == 99"),
    _p("half(x)", "returns x divided by two", "assert half(8) == 4", "assert half(3) == 1.5",
       "assert half(0) == 0"),
    _p("cube(x)", "returns x to the third power", "assert cube(2) == 8", "assert cube(-3) == -27",
       "assert cube(0) == 0"),
    _p("is_empty(items)", "returns True if the list items is empty and False otherwise",
       "assert is_empty([]) is True", "assert is_empty([1]) is False", "assert is_empty([0, 0]) is False"),
    _p("average(nums)", "returns the mean of the non-empty list of numbers nums", "assert average([1, 2, 3]) == 2",
       "assert average([5]) == 5", "assert average([1, 2]) == 1.5"),
    _p("max_list(nums)", "returns the largest number in the non-empty list nums", "assert max_list([3, 9, 2]) == 9",
       "assert max_list([-5, -1]) == -1", "assert max_list([4]) == 4"),
    _p("min_list(nums)", "returns the smallest number in the non-empty list nums", "assert min_list([3, 9, 2]) == 2",
       "assert min_list([-5, -1]) == -5", "assert min_list([4]) == 4"),
    _p("sort_list(nums)", "returns the numbers of the list nums sorted in ascending order",
       "assert sort_list([3, 1, 2]) == [1, 2, 3]", "assert sort_list([]) == []",
       "assert sort_list([5, -1, 5]) == [-1, 5, 5]"),
    _p("starts_with_a(s)", "returns True if the string s starts with the letter 'a' and False otherwise",
       "assert starts_with_a('apple') is True", "assert starts_with_a('banana') is False",
       "assert starts_with_a('') is False"),
    _p("repeat_string(s, n)", "returns the string s repeated n times", "assert repeat_string('ab', 3) == 'ababab'",
       "assert repeat_string('x', 0) == ''", "assert repeat_string('', 5) == ''"),
    _p("is_zero(n)", "returns True if n is zero and False otherwise", "assert is_zero(0) is True",
       "assert is_zero(1) is False", "assert is_zero(-1) is False"),
    _p("remainder(a, b)", "returns the remainder of a divided by b", "assert remainder(7, 3) == 1",
       "assert remainder(9, 3) == 0", "assert remainder(5, 10) == 5"),
    _p("multiply(a, b)", "returns the product of a and b", "assert multiply(3, 4) == 12",
       "assert multiply(-2, 5) == -10", "assert multiply(0, 9) == 0"),
    _p("subtract(a, b)", "returns a minus b", "assert subtract(9, 4) == 5", "assert subtract(4, 9) == -5",
       "assert subtract(0, 0) == 0"),
    _p("power(a, b)", "returns a raised to the power b", "assert power(2, 3) == 8", "assert power(5, 0) == 1",
       "assert power(3, 2) == 9"),
    _p("is_divisible(a, b)", "returns True if a is divisible by b and False otherwise",
       "assert is_divisible(10, 5) is True", "assert is_divisible(10, 3) is False",
       "assert is_divisible(0, 7) is True"),
    _p("greet(name)", "returns the string 'Hello, ' followed by name", "assert greet('Ann') == 'Hello, Ann'",
       "assert greet('Bo') == 'Hello, Bo'", "assert greet('') == 'Hello, '"),
    _p("count_char(s, c)", "returns how many times the character c occurs in the string s",
       "assert count_char('banana', 'a') == 3", "assert count_char('abc', 'z') == 0",
       "assert count_char('', 'a') == 0"),
    _p("unique_sorted(nums)", "returns the distinct numbers of the list nums in ascending order",
       "assert unique_sorted([3, 1, 3, 2]) == [1, 2, 3]", "assert unique_sorted([]) == []",
       "assert unique_sorted([5, 5]) == [5]"),
    _p("squares(n)", "returns the list of the squares of 0, 1, ..., n - 1", "assert squares(4) == [0, 1, 4, 9]",
       "assert squares(0) == []", "assert squares(1) == [0]"),
    _p("sum_to(n)", "returns the sum of the integers from 1 to n", "assert sum_to(4) == 10", "assert sum_to(1) == 1",
       "assert sum_to(0) == 0"),
    _p("is_palindrome(s)", "returns True if the string s reads the same backwards and False otherwise",
       "assert is_palindrome('level') is True", "assert is_palindrome('hello') is False",
       "assert is_palindrome('') is True"),
    _p("first_char(s)", "returns the first character of the non-empty string s", "assert first_char('hello') == 'h'",
       "assert first_char('a') == 'a'", "assert first_char('Zed') == 'Z'"),
    _p("word_count(s)", "returns the number of words in the string s (words are separated by spaces)",
       "assert word_count('one two three') == 3", "assert word_count('hello') == 1", "assert word_count('') == 0"),
    _p("contains(items, x)", "returns True if x is in the list items and False otherwise",
       "assert contains([1, 2, 3], 2) is True", "assert contains([1, 2, 3], 5) is False",
       "assert contains([], 1) is False"),
    _p("evens(nums)", "returns the even numbers of the list nums, in order", "assert evens([1, 2, 3, 4]) == [2, 4]",
       "assert evens([1, 3]) == []", "assert evens([0, 6]) == [0, 6]"),
    _p("join_words(words)", "returns the strings of the list words joined with single spaces",
       "assert join_words(['a', 'b', 'c']) == 'a b c'", "assert join_words(['hi']) == 'hi'",
       "assert join_words([]) == ''"),
    _p("celsius_to_fahrenheit(c)", "converts the temperature c from Celsius to Fahrenheit",
       "assert celsius_to_fahrenheit(0) == 32", "assert celsius_to_fahrenheit(100) == 212",
       "assert celsius_to_fahrenheit(-40) == -40"),
    _p("is_odd(n)", "returns True if n is odd and False otherwise", "assert is_odd(3) is True",
       "assert is_odd(4) is False", "assert is_odd(0) is False"),
    _p("last_char(s)", "returns the last character of the non-empty string s", "assert last_char('hello') == 'o'",
       "assert last_char('a') == 'a'", "assert last_char('xyZ') == 'Z'"),
    _p("sum_of_squares(nums)", "returns the sum of the squares of the numbers in the list nums",
       "assert sum_of_squares([1, 2, 3]) == 14", "assert sum_of_squares([]) == 0",
       "assert sum_of_squares([-2]) == 4"),
    _p("triple(x)", "returns three times x", "assert triple(3) == 9", "assert triple(-1) == -3",
       "assert triple(0) == 0"),
    _p("add(a, b)", "returns the sum of a and b", "assert add(2, 3) == 5", "assert add(-1, 1) == 0",
       "assert add(0, 0) == 0"),
    _p("is_adult(age)", "returns True if age is 18 or more and False otherwise", "assert is_adult(18) is True",
       "assert is_adult(30) is True", "assert is_adult(17) is False"),
)


def split_offline() -> tuple[list[CodeProblem], list[CodeProblem]]:
    """(train, held-out): every fourth problem is held out."""
    train = [p for i, p in enumerate(OFFLINE_PROBLEMS) if i % 4 != 3]
    test = [p for i, p in enumerate(OFFLINE_PROBLEMS) if i % 4 == 3]
    return train, test
