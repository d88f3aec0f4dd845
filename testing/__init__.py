"""Test support shipped with the package: an embedded Sentinel and Cluster built from
`redis-server`, and polling with a bound. A layer above the CLI: the tests and benchmarks
import it; nothing that serves does."""
