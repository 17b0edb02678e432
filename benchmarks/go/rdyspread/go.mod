module txnsq.invalid/benchmarks/rdyspread

go 1.21

require github.com/nsqio/go-nsq v1.1.0

require github.com/golang/snappy v0.0.1 // indirect
