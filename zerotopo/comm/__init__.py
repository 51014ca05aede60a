"""Communication: process groups per degree, instrumented collectives, block quantization."""
