#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| kvlayout_fuzz::model_config(data));
