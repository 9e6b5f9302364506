fn main() {
    let obj = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/arp-guard"));
    let mut ebpf = aya::Ebpf::load(obj).unwrap();
    let p: &mut aya::programs::SchedClassifier = ebpf.program_mut("arp_guard_egress").unwrap().try_into().unwrap();
    p.load().unwrap();
    println!("loaded ok");
}
