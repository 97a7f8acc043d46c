#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| kvlayout_fuzz::geometry_file(data));
