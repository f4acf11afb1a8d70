"""The test harness, shared by the tests and the benchmarks: the one fake backend, tiny and shaped checkpoint
builders, the live server, the session driver.
"""
