"""The `tokenrelay` client commands (`chat`, `submit`, `status`, `cancel`, `top`, `batch`), on
the HTTP client at their bottom (`http`)."""
