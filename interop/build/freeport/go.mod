module svc.io/interop/build/freeport

go 1.26.0
