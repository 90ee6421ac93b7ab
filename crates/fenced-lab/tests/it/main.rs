//! Integration tests of fenced-lab against the real peers it drives.

mod etcd;
