//! The compute simulator's own contract: ids, addresses, faults and what befalls a VM.

use super::*;

fn request(token: &str) -> CreateVm {
    CreateVm {
        name: token.into(),
        image_id: 1,
        instance_type: "small".into(),
        zone_id: 1,
        subnet_id: 7,
        security_group_ids: vec![],
        allocate_public_ipv4: false,
        ssh_pubkey: None,
        root_volume_size_gib: 10,
        userdata: String::new(),
        tags: BTreeMap::new(),
        client_token: token.into(),
    }
}

async fn address(sim: &ComputeSim, id: i64) -> Ipv4Addr {
    sim.assign_addresses_now();
    let vm = sim.get_vm(id).await.unwrap().unwrap();
    vm.private_ipv4.unwrap().parse().unwrap()
}

#[tokio::test]
async fn addresses_stay_inside_the_subnet_until_it_is_exhausted() {
    // Host bits in the flag are the network's: 127.0.60.0/28 has .11 to .14.
    let sim = ComputeSim::new("127.0.60.5/28").unwrap();
    assert_eq!(sim.cidr(), "127.0.60.0/28");
    let mut ids = Vec::new();
    for i in 0..4 {
        let vm = sim.create_vm(&request(&format!("vm-{i}"))).await.unwrap();
        ids.push(vm.id);
    }
    let mut got = Vec::new();
    for id in &ids {
        got.push(address(&sim, *id).await);
    }
    let want: Vec<Ipv4Addr> = (11..=14).map(|h| Ipv4Addr::new(127, 0, 60, h)).collect();
    assert_eq!(got, want);

    let full = sim.create_vm(&request("vm-4")).await.unwrap_err();
    match full {
        ComputeError::Rejected { status, message } => {
            assert_eq!(status, 409);
            assert!(
                message.contains("127.0.60.0/28")
                    && message.contains("InsufficientFreeAddressesInSubnet"),
                "{message}"
            );
        }
        other => panic!("not the subnet-exhausted answer: {other:?}"),
    }

    // A deleted VM's address is free again; the retried create takes it.
    sim.delete_vm(ids[1]).await.unwrap();
    let vm = sim.create_vm(&request("vm-4")).await.unwrap();
    assert_eq!(address(&sim, vm.id).await, Ipv4Addr::new(127, 0, 60, 12));
}
