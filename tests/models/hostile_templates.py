"""The red team's chat templates (time, size, recursion), shared by the
bounds' unit tests (test_template_bounds.py) and the adversarial suite."""

# (case, template, what the error says). Loops within range() but with no end in sight are
# the time bound's (test_template_bounds.py); these are refused by size or recursion at once.
HOSTILE = [
    ("string repeat", "{{ 'a' * 3000000000 }}", "repeats a value of 1 characters 3000000000"),
    ("repeat by a variable", "{% set n = 3000000000 %}{{ 'a' * n }}", "repeats a value"),
    ("list repeat", "{% set l = ['a' * 1000000] * 1000 %}{{ l|join }}", "repeats a value"),
    ("recursive macro", "{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}",
     "recursed too deeply"),
    ("doubling by ~", "{% set a = 'a' * 1000000 %}" + "{% set a = a ~ a %}" * 6 + "{{ a }}",
     "more than 16777216 characters .the ~ operator"),
    ("doubling in a namespace", "{% set ns = namespace(x='ab') %}{% for i in range(40) %}"
     "{% set ns.x = ns.x + ns.x %}{% endfor %}", "more than 16777216 characters .a sum"),
    ("center filter", "{{ 'a'|center(3000000000) }}", "passed 3000000000 to the filter"),
    ("center method", "{{ 'a'.center(3000000000) }}", "passed 3000000000 to center"),
    ("printf width", "{{ '%3000000000d' % 1 }}", "a width of more than 65536"),
    ("format width", "{{ '{:>3000000000}'.format(1) }}", "a width of more than 65536"),
    ("format filter", "{{ '%3000000000d'|format(1) }}", "a width of more than 65536"),
    ("big power", "{{ 10 ** 100000000 }}", "raised 10 to the power 100000000"),
    ("lazy map", "{{ range(60000)|map('center', 60000)|join }}",
     "more than 16777216 characters .the filter 'do_map'"),
    ("output", "{% for i in range(60000) %}{% for j in range(60000) %}{{ 'abcdefgh' }}"
     "{% endfor %}{% endfor %}", "wrote more than 16777216 characters"),
    ("compile-time fold", "{{ ('a' ~ 'b')|center(99999999) }}", "passed 99999999"),
]
