module memslice/benchmarks/goclient

go 1.22
