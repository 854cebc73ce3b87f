"""Ways of sharing a context with the target (method.md §8, §9, §13, §15): one `Method` per way (method.py), each
in its own module, all of them in one registry (registry.py). The evaluations and the pages ask the registry what to
build, what to check before a model loads and what each way costs; none of them branches on a method's name.
"""
